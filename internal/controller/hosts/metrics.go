package hosts

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	launches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_vm_launches_total",
		Help: "Launch calls to the cloud, by platform and outcome (launched, or the kind of failure).",
	}, []string{"platform", "outcome"})
	fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_vm_launch_fallbacks_total",
		Help: "Launches moved to the platform's next fallback instance type because the one before had no capacity, by platform.",
	}, []string{"platform"})
	terminations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_vm_terminations_total",
		Help: "VMs berth terminated, by platform.",
	}, []string{"platform"})
	lost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_vm_lost_total",
		Help: "Instances the cloud lost or someone stopped (gone or stopped without berth ending them), by platform.",
	}, []string{"platform"})
	leaks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_vm_leaks_terminated_total",
		Help: "Instances with this installation's tag and no record, terminated by the sweeper.",
	}, []string{"platform"})
	vmCount = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "berth_vms",
		Help: "VM records per platform (launching, booting, ready or terminating).",
	}, []string{"platform"})
	bootSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "berth_vm_boot_seconds",
		Help:    "Time from a VM's launch until berth logged in to it.",
		Buckets: prometheus.ExponentialBuckets(0.25, 2, 14),
	}, []string{"platform"})
)

func init() {
	metrics.Registry.MustRegister(launches, fallbacks, terminations, lost, leaks, vmCount, bootSeconds)
}
