package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/replay"
	"github.com/rls-project/rls/internal/server"
)

// replayOptions are rls replay's flags.
type replayOptions struct {
	config, compare, input, mapping, inputFormat, format, output, onError *string
	top                                                                   *int
	rules                                                                 descriptors.Options
	engine                                                                replay.Options
}

// replayFlags registers rls replay's flags on fs.
func replayFlags(fs *flag.FlagSet) *replayOptions {
	o := &replayOptions{}
	o.config = fs.String("config", "", "rule file or directory of *.yaml/*.yml rule files to replay against (required)")
	o.compare = fs.String("compare", "", "a second rule file or directory: decide every request under both and show what it changes")
	o.input = fs.String("input", "-", "the recorded requests: a decision log (--decision-log), JSON Lines of /json bodies with \"time\", or an Envoy JSON access log with --mapping; - for stdin")
	o.mapping = fs.String("mapping", "", "YAML file saying which fields of an Envoy JSON access log line become the domain, the time and each descriptor's entries (docs/replay.md)")
	o.inputFormat = fs.String("input-format", "auto", "auto (a decision log or /json bodies by the first line; envoy with --mapping), log, json or envoy")
	o.format = fs.String("format", "table", "table, csv or html (one self-contained page with charts)")
	o.output = fs.String("output", "-", "where the report goes; - for stdout")
	o.onError = fs.String("on-error", "stop", "a line that cannot be replayed (malformed, an unknown domain, a field the mapping names missing): stop (exit 1) or skip (say it on stderr and go on)")
	o.top = fs.Int("top", 10, "denied keys listed per rule")
	fs.BoolVar(&o.rules.MergeDomains, "merge-domains", false, "merge files that define the same domain, as serve's --merge-domains")
	fs.BoolVar(&o.rules.Overdraft, "overdraft", false, "as serve's --overdraft")
	fs.BoolVar(&o.engine.ShadowMode, "shadow-mode", false, "as serve's --shadow-mode: every rule in shadow mode")
	fs.BoolVar(&o.engine.QuotaMode, "quota-mode", false, "as serve's --quota-mode: every rule in quota mode")
	return o
}

// runReplay is `rls replay`: recorded requests decided offline against rule files.
func runReplay(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := replayFlags(fs)
	rest, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 || *o.config == "" {
		fmt.Fprintln(stderr, "usage: rls replay --config RULES [--input FILE] [--compare OTHER_RULES] [--format table|csv|html]")
		return errUsage
	}
	inFormat, err := replay.ParseFormat(*o.inputFormat)
	if err != nil {
		return fmt.Errorf("%w: --input-format: %v", errUsage, err)
	}
	switch *o.format {
	case "table", "csv", "html":
	default:
		return fmt.Errorf("%w: --format %q: want table, csv or html", errUsage, *o.format)
	}
	if *o.onError != "stop" && *o.onError != "skip" {
		return fmt.Errorf("%w: --on-error %q: want stop or skip", errUsage, *o.onError)
	}
	if *o.top < 0 {
		return fmt.Errorf("%w: --top must be ≥ 0", errUsage)
	}
	run := &replay.Run{TopKeys: *o.top}
	for _, path := range []string{*o.config, *o.compare} {
		if path == "" {
			continue
		}
		rs, err := server.LoadRules(path, o.rules)
		if err != nil {
			return err
		}
		run.Sets = append(run.Sets, replay.NewEngine(rs, o.engine))
		run.Names = append(run.Names, path)
	}
	var m *replay.Mapping
	if *o.mapping != "" {
		data, err := os.ReadFile(*o.mapping)
		if err != nil {
			return err
		}
		if m, err = replay.ParseMapping(data, *o.mapping); err != nil {
			return err
		}
	}
	in, name := io.Reader(os.Stdin), "stdin"
	if *o.input != "-" {
		f, err := os.Open(*o.input)
		if err != nil {
			return err
		}
		defer f.Close()
		in, name = f, *o.input
	}
	rd, err := replay.NewReader(in, name, inFormat, m)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *o.onError == "skip" {
		run.OnError = func(le *replay.LineError) bool {
			fmt.Fprintln(stderr, "rls replay: skipped", le)
			return true
		}
	}
	if err := run.Replay(rd); err != nil {
		var le *replay.LineError
		if errors.As(err, &le) {
			return fmt.Errorf("%w (--on-error skip goes on past such lines)", err)
		}
		return err
	}
	out := stdout
	if *o.output != "-" {
		f, err := os.Create(*o.output)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	rep := run.Report()
	switch *o.format {
	case "csv":
		err = rep.WriteCSV(out)
	case "html":
		err = rep.WriteHTML(out)
	default:
		err = rep.WriteTable(out)
	}
	if err != nil {
		return err
	}
	if f, ok := out.(*os.File); ok && f != os.Stdout {
		return f.Close()
	}
	return nil
}
