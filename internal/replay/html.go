package replay

import (
	"html/template"
	"io"
	"strconv"
)

// The chart's size and colours (TestHTMLReportInChromium looks for the colours' pixels).
const (
	chartW, chartH = 640.0, 160.0
	chartPad       = 40.0 // left, for the axis' labels
	colorAdmitted  = "#2e7d32"
	colorDenied    = "#c62828"
)

// htmlBar is one bucket of a chart: admitted stacked under denied.
type htmlBar struct {
	X, W, YA, HA, YD, HD float64
	Title                string
}

type htmlChart struct {
	Name   string
	Bars   []htmlBar
	Max    int64
	From   string
	To     string
	Top    []KeyCount
	Req    int64
	Denied int64
	Pct    string
}

type htmlRule struct {
	Domain, Rule               string
	Charts                     []htmlChart
	NewlyDenied, NewlyAdmitted int64
	Compare                    bool
}

type htmlData struct {
	Summary []string
	Errors  []string
	Rules   []htmlRule
	W, H    float64
	Pad     float64
	Admit   template.CSS
	Deny    template.CSS
	Compare bool
}

// WriteHTML writes the report as one self-contained HTML page: for each rule, a chart of
// admitted and denied over time per rule set, drawn in inline SVG, and its most denied keys.
// The page loads nothing (no script, stylesheet, font or image from anywhere).
func (rep *Report) WriteHTML(w io.Writer) error {
	d := htmlData{Summary: rep.Summary(), Errors: rep.Errors, W: chartW, H: chartH, Pad: chartPad,
		Admit: template.CSS(colorAdmitted), Deny: template.CSS(colorDenied), Compare: len(rep.Names) == 2}
	for _, r := range rep.Rules {
		hr := htmlRule{Domain: r.Domain, Rule: r.Rule, NewlyDenied: r.NewlyDenied, NewlyAdmitted: r.NewlyAdmitted, Compare: d.Compare}
		for s, name := range rep.Names {
			hr.Charts = append(hr.Charts, chartOf(name, r.Series[s], r.Top[s], r.Requests[s], r.Denied[s]))
		}
		d.Rules = append(d.Rules, hr)
	}
	return htmlPage.Execute(w, d)
}

func chartOf(name string, series []Bucket, top []KeyCount, req, denied int64) htmlChart {
	c := htmlChart{Name: name, Top: top, Req: req, Denied: denied, Pct: percent(denied, req)}
	for _, b := range series {
		c.Max = max(c.Max, b.Admitted+b.Denied)
	}
	if len(series) == 0 {
		return c
	}
	c.From, c.To = timeOf(series[0].Start), timeOf(series[len(series)-1].Start)
	bw := (chartW - chartPad) / float64(len(series))
	scale := 0.0
	if c.Max > 0 {
		scale = (chartH - 20) / float64(c.Max)
	}
	for i, b := range series {
		ha, hd := float64(b.Admitted)*scale, float64(b.Denied)*scale
		bottom := chartH - 10
		c.Bars = append(c.Bars, htmlBar{
			X: chartPad + float64(i)*bw, W: max(bw-1, 1),
			YA: bottom - ha, HA: ha, YD: bottom - ha - hd, HD: hd,
			Title: timeOf(b.Start) + ": " + strconv.FormatInt(b.Admitted, 10) + " admitted, " + strconv.FormatInt(b.Denied, 10) + " denied",
		})
	}
	return c
}

var htmlPage = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rls replay</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: left; font-size: .9em; }
td.n { text-align: right; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
.legend span { display: inline-block; width: .9em; height: .9em; vertical-align: middle; margin: 0 .3em 0 1em; }
svg text { font-size: 10px; fill: #555; }
.err { color: #a00; font-family: monospace; }
</style>
</head>
<body>
<h1>rls replay</h1>
{{range .Summary}}<p class="summary">{{.}}</p>
{{end}}{{range .Errors}}<p class="err">skipped: {{.}}</p>
{{end}}<p class="legend"><span style="background: {{.Admit}}"></span>admitted<span style="background: {{.Deny}}"></span>denied (by the rule's limit, shadow mode included)</p>
{{$d := .}}{{range .Rules}}<section class="rule">
<h2>{{.Domain}} / {{.Rule}}</h2>
{{if .Compare}}<p>{{.NewlyDenied}} descriptors newly denied, {{.NewlyAdmitted}} newly admitted by the second rule set.</p>
{{end}}<div class="charts">
{{range .Charts}}<div class="chart">
<h3>{{.Name}}: {{.Req}} requests, {{.Denied}} denied ({{.Pct}})</h3>
<svg class="series" xmlns="http://www.w3.org/2000/svg" width="{{$d.W}}" height="{{$d.H}}" viewBox="0 0 {{$d.W}} {{$d.H}}" role="img" aria-label="admitted and denied over time">
<line x1="{{$d.Pad}}" y1="{{$d.H}}" x2="{{$d.W}}" y2="{{$d.H}}" stroke="#999"></line>
<text x="2" y="14">{{.Max}}</text><text x="2" y="{{$d.H}}">0</text>
{{range .Bars}}<g><title>{{.Title}}</title><rect class="admitted" x="{{.X}}" y="{{.YA}}" width="{{.W}}" height="{{.HA}}" fill="{{$d.Admit}}"></rect><rect class="denied" x="{{.X}}" y="{{.YD}}" width="{{.W}}" height="{{.HD}}" fill="{{$d.Deny}}"></rect></g>
{{end}}</svg>
<p>{{.From}} to {{.To}}</p>
<table class="top"><thead><tr><th>most denied key</th><th>denied</th></tr></thead><tbody>
{{range .Top}}<tr><td>{{.Key}}</td><td class="n">{{.Count}}</td></tr>
{{else}}<tr><td colspan="2">none denied</td></tr>
{{end}}</tbody></table>
</div>
{{end}}</div>
</section>
{{end}}</body>
</html>
`))
