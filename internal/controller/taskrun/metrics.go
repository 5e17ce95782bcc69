package taskrun

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
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
	taskRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_task_retries_total",
		Help: "Attempts after the first of user TaskRuns that Tekton retried in place (each keeps the task's host and build user).",
	}, []string{"platform"})
	localAffinityMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_local_affinity_missing_total",
		Help: "Tasks on a local platform answered with an error because their pod template did not pin them to nodes of the platform's architecture (the admission webhook was not running when they were created, or the requirement was changed).",
	}, []string{"platform"})
)

func init() {
	metrics.Registry.MustRegister(waitSeconds, allocationSeconds, taskSeconds, mirrorReverts, cleanFailures, errorSecrets, taskRetries, localAffinityMissing)
}
