package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/version"
)

// registerBuildInfo adds rls_build_info{version,revision,goversion} 1 to reg: which rls a
// dashboard is looking at, as the start line says it.
func registerBuildInfo(reg prometheus.Registerer) {
	in := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rls_build_info",
		Help: "Always 1; its labels say which rls this is: version, commit (revision) and the Go release that built it.",
		ConstLabels: prometheus.Labels{
			"version": in.Version, "revision": in.ShortRevision(), "goversion": in.GoVersion,
		},
	})
	g.Set(1)
	reg.MustRegister(g)
}
