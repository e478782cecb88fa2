package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// dashboardFile is the Grafana dashboard, under deploy/. What its queries return on a real
// Prometheus scraping a real rls is integration/prometheus_test.go's; this test checks its form.
const dashboardFile = "grafana/rls-dashboard.json"

type dashPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

type dashboard struct {
	UID        string      `json:"uid"`
	Title      string      `json:"title"`
	Panels     []dashPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

// selectorRE finds a metric selector with its matchers; bareMetricRE a metric name of rls, gRPC,
// Go or the process that has none.
var (
	selectorRE   = regexp.MustCompile(`\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)
	bareMetricRE = regexp.MustCompile(`\b((?:rls|grpc_server|go|process)_[a-zA-Z0-9_]+)\b([^{a-zA-Z0-9_]|$)`)
)

// TestGrafanaDashboard: the dashboard is JSON Grafana imports: a data source variable every
// panel and query uses, job and instance variables every metric selector filters on, unique
// panel ids, panels that fit the 24-column grid without overlapping.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "datasource" {
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil || q != "prometheus" {
				t.Errorf("variable %s: query %s, want \"prometheus\"", v.Name, v.Query)
			}
			continue
		}
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s: data source %+v, want ${datasource}", v.Name, v.Datasource)
		}
	}
	for name, typ := range map[string]string{"datasource": "datasource", "job": "query", "instance": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s: type %q, want %q", name, vars[name], typ)
		}
	}

	ids := map[int]string{}
	var cells []dashPanel
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
			if prev, ok := ids[p.ID]; ok || p.ID == 0 {
				t.Errorf("%s: id taken by %s (or 0)", where, prev)
			}
			ids[p.ID] = p.Title
			g := p.GridPos
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("%s: gridPos %+v outside the 24-column grid", where, g)
			}
			cells = append(cells, p)
			if p.Type == "row" {
				continue
			}
			if p.Title == "" {
				t.Errorf("%s: no title", where)
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("%s: data source %+v, want ${datasource}", where, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: no query", where)
			}
			for _, tg := range p.Targets {
				where := fmt.Sprintf("%s, query %s", where, tg.RefID)
				if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s: data source %+v, want ${datasource}", where, tg.Datasource)
				}
				for _, err := range selectorsFiltered(tg.Expr) {
					t.Errorf("%s: %v", where, err)
				}
			}
		}
	}
	walk(d.Panels)
	for i, a := range cells {
		for _, b := range cells[i+1:] {
			ga, gb := a.GridPos, b.GridPos
			if ga.X < gb.X+gb.W && gb.X < ga.X+ga.W && ga.Y < gb.Y+gb.H && gb.Y < ga.Y+ga.H {
				t.Errorf("panels %q %+v and %q %+v overlap", a.Title, ga, b.Title, gb)
			}
		}
	}
}

// selectorsFiltered returns an error for each metric in expr that is not filtered on the job and
// instance variables.
func selectorsFiltered(expr string) []error {
	var errs []error
	for _, m := range bareMetricRE.FindAllStringSubmatch(expr, -1) {
		errs = append(errs, fmt.Errorf("%s without matchers", m[1]))
	}
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		for _, want := range []string{`job=~"$job"`, `instance=~"$instance"`} {
			if !strings.Contains(m[2], want) {
				errs = append(errs, fmt.Errorf("%s{%s} lacks %s", m[1], m[2], want))
			}
		}
	}
	return errs
}

// TestGrafanaDashboardCheckRejects: the form check catches a metric left unfiltered.
func TestGrafanaDashboardCheckRejects(t *testing.T) {
	for _, expr := range []string{
		`sum(rate(rls_decisions_total[5m]))`,
		`sum(rate(rls_decisions_total{job=~"$job"}[5m]))`,
		`rls_backend_up{job=~"$job", instance=~"$instance"} + rls_redis_node_up`,
	} {
		if len(selectorsFiltered(expr)) == 0 {
			t.Errorf("%s: accepted", expr)
		}
	}
	if errs := selectorsFiltered(`sum by (le) (rate(rls_backend_request_duration_seconds_bucket{job=~"$job", instance=~"$instance"}[$__rate_interval]))`); len(errs) > 0 {
		t.Errorf("a filtered selector refused: %v", errs)
	}
}
