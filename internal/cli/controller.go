package cli

import (
	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/otp/keyserver"
	"github.com/berth-ci/berth/internal/version"
)

// The controller's client limits as it ships (--kube-api-qps, --kube-api-burst).
const (
	DefaultKubeAPIQPS   = 500
	DefaultKubeAPIBurst = 1000
	// DefaultGCPercent is Go's own: the heap may grow by what is live before a collection.
	// At 50 the controller spent 14% more CPU on the bench's burst; at 100 its peak is still
	// below the upstream controller's (docs/memory.md#where-the-peak-is-made).
	DefaultGCPercent = 100
	// DefaultMaxProcs runs the controller's Go code on one processor: its work is mostly
	// waiting, and more processors cost CPU in the runtime (docs/task-cost.md).
	DefaultMaxProcs = 1
)

func newControllerCommand() *cobra.Command {
	o := controller.DefaultOptions()
	o.Namespace = defaultNamespace()
	var (
		kubeconfig string
		qps        float32
		burst      int
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: serve TaskRuns that ask for a platform",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The first line of the log says which build runs, even when it fails to start.
			v := version.Get()
			ctrl.Log.WithName("berth").Info("starting the controller", "version", v.Version, "commit", v.Commit, "namespace", o.Namespace, "concurrentReconciles", o.ConcurrentReconciles, "leaderElection", o.LeaderElection, "webhookPort", o.WebhookPort)
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			cfg.QPS, cfg.Burst = qps, burst
			mgr, err := controller.New(cfg, o)
			if err != nil {
				return err
			}
			return mgr.Start(ctrl.SetupSignalHandler())
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
	f.Float32Var(&qps, "kube-api-qps", DefaultKubeAPIQPS, "requests per second to the apiserver the controller allows itself (the apiserver's priority and fairness protects it too)")
	f.IntVar(&burst, "kube-api-burst", DefaultKubeAPIBurst, "burst above --kube-api-qps")
	f.StringVar(&o.Namespace, "namespace", o.Namespace, "the controller's namespace: config, admin secrets, internal TaskRuns (default $POD_NAMESPACE)")
	f.StringVar(&o.MetricsAddress, "metrics-bind-address", o.MetricsAddress, "address of the Prometheus metrics endpoint; 0 disables it")
	f.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "serve metrics over HTTPS, only to bearer tokens the apiserver accepts and allows get on /metrics (ClusterRole berth-metrics-reader); false serves them to anyone over HTTP")
	f.StringVar(&o.MetricsCertDir, "metrics-cert-dir", o.MetricsCertDir, "directory of the metrics' serving certificate, tls.crt and tls.key (a mounted kubernetes.io/tls Secret; reloaded when it changes); empty: a self-signed one made at start")
	f.Float32Var(&o.MetricsReviewQPS, "metrics-review-qps", 2, "reviews per second (TokenReview, SubjectAccessReview) the metrics endpoint may ask of the apiserver for tokens it has not seen; past it such a scrape gets 429. Its own budget, apart from --kube-api-qps")
	f.IntVar(&o.MetricsReviewBurst, "metrics-review-burst", 10, "reviews the metrics endpoint may ask at once above --metrics-review-qps")
	f.StringVar(&o.HealthProbeAddress, "health-probe-bind-address", o.HealthProbeAddress, "address of /healthz and /readyz; 0 disables them")
	f.StringVar(&o.PprofAddress, "pprof-bind-address", o.PprofAddress, "address of Go's profiler endpoints (/debug/pprof/), for finding where time and memory go; empty or 0 disables them")
	f.BoolVar(&o.LeaderElection, "leader-elect", o.LeaderElection, "elect a leader, so that several replicas are safe")
	f.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID, "name of the leader election lease")
	f.IntVar(&o.GCPercent, "gc-percent", DefaultGCPercent, "Go's GC percent (as GOGC): how far the heap may grow over what is live before a collection. Lower saves memory for CPU; 0, or GOGC in the environment, leaves Go's")
	f.IntVar(&o.MaxProcs, "max-procs", DefaultMaxProcs, "processors running the controller's Go code at once (as GOMAXPROCS). berth's work is mostly waiting on the apiserver and SSH; raise it for rsa-3072 user keys under bursts. 0, or GOMAXPROCS in the environment, leaves Go's (one per core, or the container's CPU limit)")
	f.IntVar(&o.ConcurrentReconciles, "concurrent-reconciles", o.ConcurrentReconciles, "TaskRuns reconciled in parallel")
	f.DurationVar(&o.WaitTimeout, "wait-timeout", o.WaitTimeout, "how long a task may wait for a host before it gets an error; 0 waits forever")
	f.DurationVar(&o.FailedTaskRetention, "failed-task-retention", o.FailedTaskRetention, "how long failed provision, clean and update TaskRuns are kept for their logs")
	f.DurationVar(&o.HostCheckInterval, "host-check-interval", o.HostCheckInterval, "how often each static host is checked; 0 disables checks")
	f.DurationVar(&o.SweepInterval, "sweep-interval", o.SweepInterval, "how often the clouds are listed for instances of this installation that no record accounts for")
	f.DurationVar(&o.LeakGrace, "leak-grace", o.LeakGrace, "how old an instance without a record must be before the sweeper terminates it")
	f.StringVar(&o.ProvisionTask, "provision-task", o.ProvisionTask, "the Task provision TaskRuns run")
	f.StringVar(&o.CleanTask, "clean-task", o.CleanTask, "the Task clean TaskRuns run")
	f.StringVar(&o.UpdateTask, "update-task", o.UpdateTask, "the Task update TaskRuns run")
	f.StringVar(&o.TaskServiceAccount, "task-service-account", o.TaskServiceAccount, "the ServiceAccount internal TaskRuns run as")
	f.StringVar(&o.Provisioner, "provisioner", o.Provisioner, "how hosts are worked on: ssh (by the controller itself; admin keys never leave it) or taskrun (internal TaskRuns, where only pods may reach hosts)")
	f.StringVar(&o.UpstreamNamespace, "upstream-namespace", o.UpstreamNamespace, "namespace of the multi-platform controller berth replaces, which no tenant may write: at berth's first start a provision TaskRun of that controller there shows which TaskRuns it served (docs/migrate-from-mpc.md)")
	f.IntVar(&o.SSHWorkers, "ssh-workers", o.SSHWorkers, "host jobs (provision, clean) the ssh provisioner runs at once")
	f.StringVar(&o.OTP.ServerURL, "otp-server-url", "", "give tasks a one-time token for their key instead of the key (secret keys otp, otp-server, otp-ca): the full https URL they POST it to, /otp included, e.g. https://berth-otp.berth-system.svc:8443/otp")
	f.StringVar(&o.OTP.CAFile, "otp-ca-file", "", "the CA certificate written into task secrets as otp-ca (default <otp-cert-dir>/ca.crt)")
	f.StringVar(&o.OTP.BindAddress, "otp-bind-address", "0", "serve the one-time-password key server here (HTTPS: POST /otp, POST /store-key, GET /healthz); 0 does not")
	f.StringVar(&o.OTP.CertDir, "otp-cert-dir", "", "directory of the key server's tls.crt, tls.key and ca.crt (a cert-manager Certificate's Secret, mounted); read again when they change")
	f.DurationVar(&o.OTP.KeyTTL, "otp-key-ttl", keyserver.DefaultTTL, "how long a task's key can be redeemed after berth stores it")
	f.StringSliceVar(&o.OTP.StoreKeyServiceAccounts, "otp-store-key-service-accounts", nil, "ServiceAccounts (namespace/name, comma-separated) whose tokens may POST /store-key; none: /store-key is refused")
	keyServerFlags(f, "otp-", &o.OTP.KubeAPIQPS, &o.OTP.KubeAPIBurst, &o.OTP.Limits, &o.OTP.UnsureReads, &o.OTP.UnsureBurst)
	f.IntVar(&o.WebhookPort, "webhook-port", o.WebhookPort, "port of the admission webhook (HTTPS) that pins local-platform TaskRuns to nodes of their architecture; 0 serves none (a local-platform task created while no replica serves it gets an error secret)")
	f.StringVar(&o.WebhookHost, "webhook-host", o.WebhookHost, "address the webhook binds (default: all)")
	f.StringVar(&o.WebhookCertDir, "webhook-cert-dir", o.WebhookCertDir, "directory of the webhook's serving certificate, tls.crt and tls.key (a mounted kubernetes.io/tls Secret; reloaded when it changes)")
	return cmd
}
