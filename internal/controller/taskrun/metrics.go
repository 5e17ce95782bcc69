package taskrun

import (
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
		Help:    "Time from reserving a host until the task's secret existed (provisioning included).",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	}, []string{"platform"})
	taskSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_task_run_seconds",
		Help:    "Time a user TaskRun held its host, from reservation to release.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 16),
	}, []string{"platform"})
	internalTasks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_internal_taskruns_total",
		Help: "Provision, clean and update TaskRuns that ended, by outcome.",
	}, []string{"type", "outcome"})
	errorSecrets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_error_secrets_total",
		Help: "User tasks answered with an error secret, by reason.",
	}, []string{"reason"})
	waitingTasks = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_waiting_tasks",
		Help: "User TaskRuns waiting for a host, per platform.",
	}, []string{"platform"})
	runningTasks = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_running_tasks",
		Help: "User TaskRuns holding a host, per platform.",
	}, []string{"platform"})
	slotsUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_host_slots_used",
		Help: "Tasks on each static host.",
	}, []string{"host", "platform"})
	slotsCapacity = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_host_slots_capacity",
		Help: "Concurrency of each static host; 0 while quarantined or after removal from the config.",
	}, []string{"host", "platform"})
	hostQuarantined = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_host_quarantined",
		Help: "1 while a host's last health check failed.",
	}, []string{"host"})
)

func init() {
	metrics.Registry.MustRegister(waitSeconds, allocationSeconds, taskSeconds, internalTasks, errorSecrets,
		waitingTasks, runningTasks, slotsUsed, slotsCapacity, hostQuarantined)
}

// publishUsage sets the occupancy gauges from the ledger. The vectors are reset first, so a
// host removed from the config (or a platform nobody waits for) leaves no stale series behind.
func publishUsage(l *allocation.Ledger) {
	usage := l.Usage()
	slotsUsed.Reset()
	slotsCapacity.Reset()
	hostQuarantined.Reset()
	running := map[string]int{}
	for _, u := range usage {
		capacity := u.Capacity
		if u.Quarantined || u.Retired {
			capacity = 0
		}
		slotsUsed.WithLabelValues(u.Host, u.Platform).Set(float64(u.Used))
		slotsCapacity.WithLabelValues(u.Host, u.Platform).Set(float64(capacity))
		q := 0.0
		if u.Quarantined {
			q = 1
		}
		hostQuarantined.WithLabelValues(u.Host).Set(q)
		running[u.Platform] += u.Used
	}
	runningTasks.Reset()
	for p, n := range running {
		runningTasks.WithLabelValues(p).Set(float64(n))
	}
	waitingTasks.Reset()
	for p, n := range l.Waiting() {
		waitingTasks.WithLabelValues(p).Set(float64(n))
	}
}
