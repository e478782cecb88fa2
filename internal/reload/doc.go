// Package reload calls a function whenever rule files change on disk, and whenever a signal
// (SIGHUP, in rls) asks for it.
//
// It watches directories, never files: an editor that saves by writing a new file and renaming it
// over the old one replaces the inode a file watch would be attached to. For a rule directory it
// watches the directory, for its rule files (as descriptors.Load picks them: *.yaml and *.yml,
// not starting with '.') and for names starting with "..", which are the kubelet's: a ConfigMap
// volume holds api.yaml -> ..data/api.yaml and ..data -> ..2026_11_30_05_00_00.123, and an update
// writes a new timestamped directory and swaps the ..data symlink, so every event of an update
// is in the watched directory and none names api.yaml. For a single rule file it watches the
// file's directory for that name and for ".." names, and also the directory the file resolves
// to when it is a symlink. It also watches the parent of a rule directory, so a directory that is
// itself replaced, or a symlink to it that is swapped, is noticed; after every such change the
// watches are pointed again at what the path names now.
//
// Events are debounced: a reload runs once the files have been quiet for the debounce, so an
// update made of many events (a ConfigMap swap, an editor's save) is loaded once, whole. A signal
// reloads at once. Reloads run one at a time, in the goroutine that called Run. What is not
// watched (a file behind a symlink into another directory's subdirectory edited in place, a
// path on a file system without notifications) is reloaded by a signal.
package reload
