package descriptors

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/rls-project/rls/internal/limit"
)

// Options changes how rule files are found and combined. The zero value is rls's own layout.
type Options struct {
	// AllFiles loads every regular file of a directory and of its subdirectories, whatever its
	// name, as envoyproxy/ratelimit's runtime directory is read; otherwise only the directory's
	// own *.yaml and *.yml files.
	AllFiles bool
	// DotFiles also loads files and directories whose names start with '.'. Leave it off for a
	// Kubernetes ConfigMap mount, whose ..data entries hold a second copy of every file.
	DotFiles bool
	// MergeDomains merges files that define the same domain (their descriptors put together)
	// instead of rejecting the second, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does.
	MergeDomains bool
	// Overdraft gives every limit of algorithm gcra or fixed_window overdraft, as if its rule
	// said overdraft: true: hits reported past the limit are charged (into debt), as
	// envoyproxy/ratelimit counts every hit. Rules that come over xDS have no overdraft field.
	Overdraft bool
	// GlobalDomains makes the limits of these domains global across regions (Limit.Spec.Shared)
	// unless a limit says global: false. Only limits that can be global become so (algorithm
	// gcra, no overdraft); the others stay per region.
	GlobalDomains []string
}

// Load loads a rule file, or every *.yaml and *.yml file of a directory (not recursing, skipping
// names that start with '.', which covers Kubernetes ConfigMap mounts' ..data entries). Every
// problem found is returned at once, joined, each naming its file and line.
func Load(path string) (*RuleSet, error) { return LoadWith(path, Options{}) }

// LoadWith is Load with opts.
func LoadWith(path string, opts Options) (*RuleSet, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("descriptors: %w", err)
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("descriptors: %w", err)
		}
		return ParseWith(map[string][]byte{path: data}, opts)
	}
	return loadFS(os.DirFS(path), ".", path, opts)
}

// LoadFS loads the rule files of directory dir of fsys; prefix is prepended to file names in
// errors and in RuleSet.Files.
func LoadFS(fsys fs.FS, dir, prefix string) (*RuleSet, error) {
	return loadFS(fsys, dir, prefix, Options{})
}

func loadFS(fsys fs.FS, dir, prefix string, opts Options) (*RuleSet, error) {
	files := map[string][]byte{}
	root := filepath.ToSlash(filepath.Clean(dir))
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return fmt.Errorf("descriptors: %w", err)
		}
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") && !opts.DotFiles {
				continue
			}
			p := filepath.ToSlash(filepath.Join(dir, name))
			info, err := fs.Stat(fsys, p) // follows symlinks
			if err != nil {
				continue
			}
			if info.IsDir() {
				// Subdirectories only when loading every file, and not through a symlink
				// (e.IsDir is false for one), which envoyproxy/ratelimit's runtime does not
				// follow either.
				if opts.AllFiles && e.IsDir() && depth < limit.MaxEntries {
					if err := walk(p, depth+1); err != nil {
						return err
					}
				}
				continue
			}
			if !opts.AllFiles && !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
				continue
			}
			data, err := fs.ReadFile(fsys, p)
			if err != nil {
				return fmt.Errorf("descriptors: %w", err)
			}
			rel := p
			if root != "." {
				rel = strings.TrimPrefix(p, root+"/")
			}
			files[filepath.Join(prefix, filepath.FromSlash(rel))] = data
		}
		return nil
	}
	if err := walk(dir, 0); err != nil {
		return nil, err
	}
	if len(files) == 0 {
		if opts.AllFiles {
			return nil, fmt.Errorf("descriptors: %s: no rule files", prefix)
		}
		return nil, fmt.Errorf("descriptors: %s: no *.yaml or *.yml rule files", prefix)
	}
	return ParseWith(files, opts)
}

// Parse builds a RuleSet from rule files given as name → content.
func Parse(files map[string][]byte) (*RuleSet, error) { return ParseWith(files, Options{}) }

// ParseWith is Parse with opts (MergeDomains and Overdraft apply).
func ParseWith(files map[string][]byte, opts Options) (*RuleSet, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	b := &builder{rs: &RuleSet{domains: map[string]*level{}, Files: names}, domainFile: map[string]string{}, overdraft: opts.Overdraft,
		globalDomains: opts.GlobalDomains}
	if opts.MergeDomains {
		b.merged = map[string]*mergedDomain{}
	}
	for _, name := range names {
		b.file(name, files[name])
	}
	b.buildMerged()
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	slices.SortFunc(b.rs.Domains, func(a, b DomainInfo) int { return strings.Compare(a.Name, b.Name) })
	return b.rs, nil
}
