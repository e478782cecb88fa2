package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/envoytest"
)

// composeFile is the part of the Compose schema compose.yaml uses. Decoding with known fields
// only catches a misspelled key, which Compose itself would reject.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command   []string `yaml:"command"`
	Volumes   []string `yaml:"volumes"`
	Ports     []string `yaml:"ports"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

func TestCompose(t *testing.T) {
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cf composeFile
	if err := dec.Decode(&cf); err != nil {
		t.Fatal(err)
	}
	e := envoytest.LoadEdge(t, "envoy/envoy.yaml")
	mounts := func(s composeService) map[string]string { // container path → host path
		out := map[string]string{}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			out[parts[1]] = parts[0]
		}
		return out
	}
	checks := []struct {
		name  string
		check func() error
	}{
		{"services", func() error {
			var names []string
			for n := range cf.Services {
				names = append(names, n)
			}
			slices.Sort(names)
			if want := []string{"echo", "envoy", "redis", "rls"}; !slices.Equal(names, want) {
				return fmt.Errorf("services %q, want %q", names, want)
			}
			return nil
		}},
		{"images pinned, rls built from the Dockerfile", func() error {
			for n, s := range cf.Services {
				switch {
				case s.Build != nil:
					if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
						return fmt.Errorf("%s: %v", n, err)
					}
				case s.Image == "":
					return fmt.Errorf("%s: neither image nor build", n)
				default:
					if err := pinned(s.Image); err != nil {
						return fmt.Errorf("%s: %v", n, err)
					}
				}
			}
			if cf.Services["rls"].Build == nil {
				return errors.New("rls is not built from this repository")
			}
			return nil
		}},
		{"mounted files exist", func() error {
			for n, s := range cf.Services {
				for _, host := range mounts(s) {
					if _, err := os.Stat(host); err != nil {
						return fmt.Errorf("%s: %v", n, err)
					}
				}
			}
			return nil
		}},
		{"dependencies exist and wait for health only where there is a check", func() error {
			for n, s := range cf.Services {
				for dep, d := range s.DependsOn {
					target, ok := cf.Services[dep]
					if !ok {
						return fmt.Errorf("%s depends on unknown %s", n, dep)
					}
					if d.Condition == "service_healthy" && target.Healthcheck == nil {
						return fmt.Errorf("%s waits for %s to be healthy, which has no healthcheck", n, dep)
					}
				}
			}
			return nil
		}},
		{"rls serves the rules with Redis", func() error {
			rls := cf.Services["rls"]
			f := flagValues(rls.Command)
			if f["backend"] != "redis" || f["redis-url"] != "redis://redis:6379" {
				return fmt.Errorf("command %q", rls.Command)
			}
			if host := mounts(rls)[f["config"]]; host != "./envoy/rules" {
				return fmt.Errorf("--config %q is %q on the host, want ./envoy/rules", f["config"], host)
			}
			return nil
		}},
		{"Envoy runs envoy.yaml and its clusters name these services", func() error {
			envoy := cf.Services["envoy"]
			cfgPath := envoy.Command[slices.Index(envoy.Command, "-c")+1]
			if host := mounts(envoy)[cfgPath]; host != "./envoy/envoy.yaml" {
				return fmt.Errorf("envoy -c %q is %q on the host", cfgPath, host)
			}
			for name, c := range e.Clusters {
				for _, ep := range c.GetLoadAssignment().GetEndpoints() {
					for _, lb := range ep.GetLbEndpoints() {
						addr := lb.GetEndpoint().GetAddress().GetSocketAddress()
						if _, ok := cf.Services[addr.GetAddress()]; !ok {
							return fmt.Errorf("cluster %s points at %q, not a service here", name, addr.GetAddress())
						}
					}
				}
			}
			if port := e.Clusters["rls"].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8081 {
				return fmt.Errorf("rls cluster port %d, rls's default --grpc-addr is :8081", port)
			}
			return nil
		}},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			if err := ck.check(); err != nil {
				t.Error(err)
			}
		})
	}
}
