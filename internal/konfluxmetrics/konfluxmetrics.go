// Package konfluxmetrics exports berth's task and host lifecycle also under the series of the
// multi-platform controller berth replaces (multi_platform_controller_*), because Konflux's
// dashboard and alert rules query only those: after a switch they must keep their data.
//
// Nothing here keeps a count of its own. Each function is called at the point where berth
// records the same event in its own metrics (a build user made, a clean failed, a VM that
// never came up), and the task gauges are read from the capacity ledger at scrape time
// (package capacity), so the two sets cannot disagree. docs/metrics.md maps each series to
// berth's lifecycle and says where the meaning differs from upstream's.
//
// Names, types, labels and buckets are upstream's (konflux-ci/multi-platform-controller,
// pkg/metrics): counters without the _total suffix, the platform with "/" written as "-".
// Upstream gives each platform its own collectors with platform as a constant label; here it
// is a variable label of one vector per series, which Prometheus exposes identically.
package konfluxmetrics

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/berth-ci/berth/internal/config"
)

// Subsystem prefixes every series, as upstream names them.
const Subsystem = "multi_platform_controller"

// Label names.
const (
	PlatformLabel  = "platform"
	NamespaceLabel = "taskrun_namespace"
)

// The buckets are upstream's, in seconds, and the dashboard's quantiles are computed from them:
// any other edges would change what its panels show.
var (
	// ShortBuckets serve host_allocation_time and wait_time.
	ShortBuckets = []float64{1, 2, 3, 4, 5, 10, 15, 20, 30, 60, 120, 300, 600, 1200}
	// LongBuckets serve task_run_time.
	LongBuckets = []float64{20, 40, 60, 90, 120, 300, 600, 1200, 2400, 4800, 6000, 7200, 8400, 9600}
)

func counter(name, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: Subsystem, Name: name, Help: help}, []string{PlatformLabel})
}

func histogram(name, help string, buckets []float64) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: Subsystem, Name: name, Help: help, Buckets: buckets}, []string{PlatformLabel})
}

var (
	provisioningSuccesses = counter("provisioning_successes",
		"Build users berth made on a host and handed to their task (a static host's slot, a VM's, a pooled VM's), per platform.")
	provisioningFailures = counter("provisioning_failures",
		"Failed attempts to make a task's build user on a host (the task tries another host), and VMs that never came up within the allocation timeout, per platform.")
	hostAllocationFailures = counter("host_allocation_failures",
		"Tasks answered with an error because no host could be had for them (all hosts failed, wait timeout, the cloud refused for good), and failed VM launch calls, per platform.")
	cleanupFailures = counter("cleanup_failures",
		"Failed attempts to remove a build user from a host (each is retried with backoff), per platform.")
	hostAllocationTime = histogram("host_allocation_time",
		"Seconds from reserving a slot for a task until its build user was made and handed over.", ShortBuckets)
	waitTime = histogram("wait_time",
		"Seconds from a task's creation until a slot was reserved for it (a VM's launch and boot included).", ShortBuckets)
	taskRunTime = histogram("task_run_time",
		"Seconds from a task's creation until its TaskRun completed, waiting and allocation included.", LongBuckets)
	poolSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: Subsystem, Name: "platform_pool_size",
		Help: "Tasks a platform can run at once under the config in force: its static hosts' slots, or max-instances times the VMs' concurrency."},
		[]string{PlatformLabel})
)

// The task gauges are made at scrape time from the ledger (see Tasks), so they have
// descriptions and no vectors: a namespace or platform with no task has no series at all.
var (
	runningDesc = prometheus.NewDesc(prometheus.BuildFQName("", Subsystem, "running_tasks"),
		"User TaskRuns holding a slot of a host, per platform and namespace.", []string{PlatformLabel, NamespaceLabel}, nil)
	waitingDesc = prometheus.NewDesc(prometheus.BuildFQName("", Subsystem, "waiting_tasks"),
		"User TaskRuns waiting for a slot, per platform and namespace.", []string{PlatformLabel, NamespaceLabel}, nil)
)

func init() {
	metrics.Registry.MustRegister(provisioningSuccesses, provisioningFailures, hostAllocationFailures, cleanupFailures,
		hostAllocationTime, waitTime, taskRunTime, poolSize)
}

// Platform is a platform as upstream's label writes it: linux/arm64 is linux-arm64.
func Platform(platform string) string { return strings.ReplaceAll(platform, "/", "-") }

// ServePlatforms is called with each config put in force: the pool size of each platform that
// holds hosts (local platforms have none; upstream exports nothing for them either), and every
// counter and histogram of those platforms made at zero. Without the zeros, a platform whose
// every provisioning fails would have no provisioning_successes series, the success ratio of
// MultiPlatformControllerPlatformUnhealthy would have no value, and the alert could never
// fire; and increase() would miss a series' first event. A platform the config no longer
// names loses its pool size; its counters stay, as counters do.
func ServePlatforms(sizes map[string]int) {
	poolSize.Reset()
	for p, n := range sizes {
		label := Platform(p)
		poolSize.WithLabelValues(label).Set(float64(n))
		for _, c := range []*prometheus.CounterVec{provisioningSuccesses, provisioningFailures, hostAllocationFailures, cleanupFailures} {
			c.WithLabelValues(label)
		}
		for _, h := range []*prometheus.HistogramVec{hostAllocationTime, waitTime, taskRunTime} {
			h.WithLabelValues(label)
		}
	}
}

// PoolSizes are the pool sizes of a config's platforms (config.Config.Report): how many tasks
// each can run at once, which for a pool of VMs is max-instances times their concurrency (see
// docs/metrics.md for upstream's), 0 for a platform whose settings are broken (it serves
// nothing until they are fixed). Local platforms hold no hosts and are left out.
func PoolSizes(report []config.PlatformReport) map[string]int {
	out := map[string]int{}
	for _, r := range report {
		switch {
		case r.Strategy == config.StrategyLocal:
		case !r.Usable:
			out[string(r.Platform)] = 0
		default:
			out[string(r.Platform)] = r.Capacity
		}
	}
	return out
}

// Provisioned counts a build user made and handed over, and how long that took from the
// slot's reservation.
func Provisioned(platform string, sinceReserved time.Duration) {
	label := Platform(platform)
	provisioningSuccesses.WithLabelValues(label).Inc()
	hostAllocationTime.WithLabelValues(label).Observe(sinceReserved.Seconds())
}

// ProvisioningFailed counts one failed attempt to make a task's build user, or a VM that never
// came up.
func ProvisioningFailed(platform string) {
	provisioningFailures.WithLabelValues(Platform(platform)).Inc()
}

// HostAllocationFailures is the counter of the platform's failed host allocations, for
// callers that count only once an answer is written.
func HostAllocationFailures(platform string) prometheus.Counter {
	return hostAllocationFailures.WithLabelValues(Platform(platform))
}

// CleanupFailed counts a failed removal of a build user.
func CleanupFailed(platform string) { cleanupFailures.WithLabelValues(Platform(platform)).Inc() }

// Reserved observes a task's wait, from its creation until a slot was reserved for it.
func Reserved(platform string, sinceCreated time.Duration) {
	waitTime.WithLabelValues(Platform(platform)).Observe(sinceCreated.Seconds())
}

// Completed observes a task's whole time, from its creation until its TaskRun completed.
func Completed(platform string, sinceCreated time.Duration) {
	taskRunTime.WithLabelValues(Platform(platform)).Observe(sinceCreated.Seconds())
}

// DescribeTasks sends the task gauges' descriptions, for the collector that makes them.
func DescribeTasks(ch chan<- *prometheus.Desc) {
	ch <- runningDesc
	ch <- waitingDesc
}

// Tasks sends the task gauges of one platform and namespace. A zero is not sent: upstream set
// its gauges only for the pairs it found tasks of, so a pair whose last task ended kept its
// last value for as long as the process ran; here the series is simply gone.
func Tasks(ch chan<- prometheus.Metric, platform, namespace string, running, waiting int) {
	label := Platform(platform)
	if running > 0 {
		ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(running), label, namespace)
	}
	if waiting > 0 {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(waiting), label, namespace)
	}
}
