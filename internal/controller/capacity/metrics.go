package capacity

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
)

func init() { metrics.Registry.MustRegister(occupancy) }

// Publish makes the ledger the one berth's metrics report.
func (c *Capacity) Publish() { occupancy.ledger.Store(c.ledger) }

// occupancy reports the ledger's state when Prometheus scrapes, not when it changes: it can
// never be stale (a host removed from the config is simply absent) and costs the reconcile
// loop nothing. Publish points it at the running controller's.
var occupancy = &ledgerCollector{}

type ledgerCollector struct {
	ledger atomic.Pointer[allocation.Ledger]
}

var (
	waitingDesc     = prometheus.NewDesc("berth_waiting_tasks", "User TaskRuns waiting for a host, per platform.", []string{"platform"}, nil)
	runningDesc     = prometheus.NewDesc("berth_running_tasks", "User TaskRuns holding a host, per platform.", []string{"platform"}, nil)
	usedDesc        = prometheus.NewDesc("berth_host_slots_used", "Tasks on each static host.", []string{"host", "platform"}, nil)
	capacityDesc    = prometheus.NewDesc("berth_host_slots_capacity", "Concurrency of each static host; 0 while quarantined or after removal from the config.", []string{"host", "platform"}, nil)
	quarantinedDesc = prometheus.NewDesc("berth_host_quarantined", "1 while a host's last health check failed.", []string{"host"}, nil)
)

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{waitingDesc, runningDesc, usedDesc, capacityDesc, quarantinedDesc} {
		ch <- d
	}
	konfluxmetrics.DescribeTasks(ch)
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	l := c.ledger.Load()
	if l == nil {
		return
	}
	running := map[string]int{}
	for _, u := range l.Usage() {
		capacity, quarantined := u.Capacity, 0.0
		if u.Quarantined {
			quarantined = 1
		}
		if u.Quarantined || u.Retired {
			capacity = 0
		}
		ch <- prometheus.MustNewConstMetric(usedDesc, prometheus.GaugeValue, float64(u.Used), u.Host, u.Platform)
		ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(capacity), u.Host, u.Platform)
		ch <- prometheus.MustNewConstMetric(quarantinedDesc, prometheus.GaugeValue, quarantined, u.Host)
		running[u.Platform] += u.Used
	}
	for p, n := range running {
		ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(n), p)
	}
	for p, n := range l.Waiting() {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(n), p)
	}
	// Konflux's running_tasks counts TaskRuns that hold a host, as upstream's did; a slot held
	// for a clean still owed is no task's.
	for _, n := range l.ByNamespace(IsDebt) {
		konfluxmetrics.Tasks(ch, n.Platform, n.Namespace, n.Holding, n.Waiting)
	}
}
