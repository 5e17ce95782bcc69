package version

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// buildInfo tells dashboards which build runs where: one series, always 1, whose labels are
// this binary's Info.
var buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "berth_build_info",
	Help: "Always 1; its labels say which build of berth this process runs: version (git describe at build time), commit, goversion.",
}, []string{"version", "commit", "goversion"})

func init() {
	i := Get()
	buildInfo.WithLabelValues(i.Version, i.Commit, i.GoVersion).Set(1)
	metrics.Registry.MustRegister(buildInfo)
}
