package taskrun

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-ci/berth/internal/allocation"
)

var (
	waitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_wait_seconds",
		Help:    "Time from a user TaskRun's creation until a host was reserved for it.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 18),
	}, []string{"platform"})
	allocationSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_allocation_seconds",
		Help:    "Time from reserving a host until the task's secret was written (provisioning included).",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	}, []string{"platform"})
	taskSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_task_run_seconds",
		Help:    "Time a user TaskRun held its host, from reservation to release.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 16),
	}, []string{"platform"})
	mirrorReverts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "berth_mirror_reverts_total",
		Help: "Edits of berth's labels, annotations or finalizer on user TaskRuns that berth undid.",
	})
	cleanFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_clean_failures_total",
		Help: "Failed attempts to remove a build user from a host; each is retried with backoff.",
	}, []string{"host"})
	errorSecrets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_error_secrets_total",
		Help: "User tasks answered with an error secret, by reason.",
	}, []string{"reason"})
	localAffinityMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_local_affinity_missing_total",
		Help: "Tasks on a local platform answered with an error because their pod template did not pin them to nodes of the platform's architecture (the admission webhook was not running when they were created, or the requirement was changed).",
	}, []string{"platform"})
)

func init() {
	metrics.Registry.MustRegister(waitSeconds, allocationSeconds, taskSeconds, mirrorReverts, cleanFailures, errorSecrets, localAffinityMissing, occupancy)
}

// occupancy reports the ledger's state when Prometheus scrapes, not when it changes: it can
// never be stale (a host removed from the config is simply absent) and costs the reconcile
// loop nothing. SetupWithManager points it at the running reconciler's ledger.
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
}
