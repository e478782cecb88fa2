package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/server"
	"github.com/rls-project/rls/internal/service"
)

// validateOptions are rls validate's flags.
type validateOptions struct {
	config  *string
	callers *string
	rules   descriptors.Options
}

// validateFlags registers rls validate's flags on fs.
func validateFlags(fs *flag.FlagSet) *validateOptions {
	o := &validateOptions{}
	o.config = fs.String("config", "", "rule file or directory of *.yaml/*.yml rule files (or give it as the argument)")
	fs.BoolVar(&o.rules.AllFiles, "config-all-files", false, "every file of the directory and of its subdirectories, as serve's --config-all-files")
	fs.BoolVar(&o.rules.DotFiles, "config-dot-files", false, "also files whose names start with '.', as serve's --config-dot-files")
	fs.BoolVar(&o.rules.MergeDomains, "merge-domains", false, "merge files that define the same domain, as serve's --merge-domains")
	o.callers = fs.String("caller-policy", "", "also check this caller policy file, as serve's --caller-policy (alone: only it)")
	return o
}

// runValidate loads rule files and reports every problem. The path comes as an argument or as
// --config, the flag serve reads it from.
func runValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := validateFlags(fs)
	config, callers := o.config, o.callers
	usage := func() error {
		fmt.Fprintln(stderr, "usage: rls validate PATH, or rls validate --config PATH (a rule file or a directory of *.yaml/*.yml files), or rls validate --caller-policy FILE")
		return errUsage
	}
	rest, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	path := *config
	switch {
	case path != "" && len(rest) == 0:
	case path == "" && len(rest) == 1:
		path = rest[0]
	case path == "" && len(rest) == 0 && *callers != "":
		return validatePolicy(*callers, stdout)
	default:
		return usage()
	}
	if *callers != "" {
		if err := validatePolicy(*callers, stdout); err != nil {
			return err
		}
	}
	// o.rules is read now, after the flags set it.
	rs, err := server.LoadRules(path, o.rules)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ok: %d domain(s) from %d file(s)\n", len(rs.Domains), len(rs.Files))
	for _, d := range rs.Domains {
		fmt.Fprintf(stdout, "  %s (%s): %d rule(s)\n", d.Name, d.File, len(d.Rules))
	}
	return nil
}

// descriptorFlag collects --descriptor flags, each read by service.ParseDescriptor, as rls
// inspect and rls reset read theirs.
type descriptorFlag []*ratelimitv3.RateLimitDescriptor

func (d *descriptorFlag) String() string { return "" }

func (d *descriptorFlag) Set(s string) error {
	desc, err := service.ParseDescriptor(s)
	if err != nil {
		return err
	}
	*d = append(*d, desc)
	return nil
}

// descriptorUsage is the help of the commands' --descriptor flag.
const descriptorUsage = "a descriptor as " + service.DescriptorFormat + "; repeat for several; arguments after the flags count too"

// checkOptions are rls check's flags.
type checkOptions struct {
	addr, domain *string
	hits         *uint
	timeout      *time.Duration
	descs        *descriptorFlag
	tls          *clientTLS
}

// checkFlags registers rls check's flags on fs.
func checkFlags(fs *flag.FlagSet) *checkOptions {
	o := &checkOptions{descs: &descriptorFlag{}}
	o.addr = fs.String("addr", "localhost:8081", "rls gRPC address, host:port (rls serve's --grpc-addr)")
	o.domain = fs.String("domain", "example", "rate-limit domain")
	o.hits = fs.Uint("hits", 0, "hits_addend (0 means 1)")
	o.timeout = fs.Duration("timeout", 5*time.Second, "deadline for the call")
	fs.Var(o.descs, "descriptor", descriptorUsage)
	o.tls = clientTLSFlags(fs, "connect with TLS, as any --tls-* flag does; verified against the system's roots unless --tls-ca")
	return o
}

// runCheck sends one ShouldRateLimit request and prints the response as JSON. It returns
// errOverLimit (exit status 2) when the answer is OVER_LIMIT. A domain the server's rules do not
// define is said on stderr, the answer (OK, as Envoy sees it) unchanged.
func runCheck(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := checkFlags(fs)
	addr, domain, hits, timeout, descs := o.addr, o.domain, o.hits, o.timeout, o.descs
	rest, err := parseFlags(fs, args, env)
	if err != nil {
		return err
	}
	for _, a := range rest {
		if err := descs.Set(a); err != nil {
			fmt.Fprintln(stderr, "rls check:", err)
			return errUsage
		}
	}
	if len(*descs) == 0 {
		fmt.Fprintln(stderr, "rls check: give at least one descriptor, e.g. rls check api_key=k1")
		return errUsage
	}
	if *hits > math.MaxUint32 {
		fmt.Fprintf(stderr, "rls check: --hits %d: hits_addend is 32 bits, at most %d\n", *hits, uint64(math.MaxUint32))
		return errUsage
	}
	creds := insecure.NewCredentials()
	if o.tls.wanted() {
		cfg, err := o.tls.config()
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var header metadata.MD
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: *domain, Descriptors: *descs, HitsAddend: uint32(*hits),
	}, grpc.Header(&header))
	if err != nil {
		return fmt.Errorf("ShouldRateLimit %s: %w", *addr, err)
	}
	if err := writeCheck(stdout, resp); err != nil {
		return err
	}
	if len(header.Get(service.UnknownDomainHeader)) > 0 {
		fmt.Fprintf(stderr, "rls check: domain %q is in none of the server's rules: nothing was limited\n", *domain)
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		return errOverLimit
	}
	return nil
}
