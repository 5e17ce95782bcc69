package cli

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/kubescheme"
	"github.com/berth-ci/berth/internal/otp/keyserver"
	"github.com/berth-ci/berth/internal/version"
)

func newOTPServerCommand() *cobra.Command {
	var (
		kubeconfig, metricsAddress, healthAddress string
		leaderElect                               bool
		qps                                       float32
		burst                                     int
		store                                     = keyserver.Store{Namespace: defaultNamespace(), TTL: keyserver.DefaultTTL}
		serve                                     = keyserver.ServeOptions{Addr: ":8443"}
	)
	cmd := &cobra.Command{
		Use:   "otp-server",
		Short: "Run the one-time-password key server alone: tasks redeem their key's token once over HTTPS",
		Long: `The key server hands a task its private key once, for the one-time token in its secret
(POST /otp), as the buildah-remote Tasks expect. Keys are kept sealed under their tokens in
Secrets of berth's namespace, so a restart loses none; they are written by berth's controller
(--otp-server-url) or, for the ServiceAccounts named in --store-key-service-accounts only, through
POST /store-key. The controller can serve the same endpoints itself (--otp-bind-address).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The first line of the log says which build runs, even when it fails to start.
			v := version.Get()
			ctrl.Log.WithName("berth").Info("starting the key server", "version", v.Version, "commit", v.Commit, "namespace", store.Namespace, "address", serve.Addr)
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			cfg.QPS, cfg.Burst = qps, burst
			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme: kubescheme.New(),
				// The records and TaskRuns, cut as the controller cuts them, only to tell the
				// attempt a retried task is in (keyserver.Attempts): a replay of its redeemed
				// token is then refused from memory. Listed at the first such redemption.
				Cache:                         taskrun.CacheOptions(store.Namespace),
				Metrics:                       metricsserver.Options{BindAddress: metricsAddress},
				HealthProbeBindAddress:        healthAddress,
				LeaderElection:                leaderElect,
				LeaderElectionID:              "berth-otp-server",
				LeaderElectionNamespace:       store.Namespace,
				LeaderElectionReleaseOnCancel: true,
			})
			if err != nil {
				return err
			}
			if store.Client, err = client.New(cfg, client.Options{Scheme: mgr.GetScheme()}); err != nil {
				return err
			}
			store.Attempts = taskrun.CachedAttempts{Cache: mgr.GetCache(), Namespace: store.Namespace}
			if err := keyserver.Serve(mgr, &store, serve); err != nil {
				return err
			}
			if err := mgr.Add(keyserver.Sweeper{Store: &store}); err != nil {
				return err
			}
			if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
	f.Float32Var(&qps, "kube-api-qps", 100, "requests per second to the apiserver the process allows itself for its sweep and leader election (redemptions and /store-key have their own client: --redeem-kube-api-qps)")
	f.IntVar(&burst, "kube-api-burst", 200, "burst above --kube-api-qps")
	f.StringVar(&store.Namespace, "namespace", store.Namespace, "berth's namespace, where the keys and the tasks' records are (default $POD_NAMESPACE)")
	f.StringVar(&serve.Addr, "bind-address", serve.Addr, "where the key server listens (HTTPS)")
	f.StringVar(&serve.CertDir, "cert-dir", "", "directory of the server's tls.crt and tls.key (a cert-manager Certificate's Secret, mounted); read again when they change")
	f.DurationVar(&store.TTL, "key-ttl", store.TTL, "how long a key stored through POST /store-key can be redeemed")
	f.StringSliceVar(&serve.StoreKeyServiceAccounts, "store-key-service-accounts", nil, "ServiceAccounts (namespace/name, comma-separated) whose tokens may POST /store-key; none: /store-key is refused")
	f.StringVar(&metricsAddress, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint; 0 disables it")
	f.StringVar(&healthAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz; 0 disables them")
	f.BoolVar(&leaderElect, "leader-elect", false, "elect a leader for the sweep of expired keys, when several replicas serve")
	keyServerFlags(f, "", &serve.KubeAPIQPS, &serve.KubeAPIBurst, &serve.Limits, &serve.UnsureReads, &serve.UnsureBurst)
	_ = cmd.MarkFlagRequired("cert-dir")
	return cmd
}

// keyServerFlags are the key server's own apiserver budget and its limits on clients, named
// with prefix in the controller (otp-) and without in otp-server.
func keyServerFlags(f *pflag.FlagSet, prefix string, qps *float32, burst *int, limits *keyserver.Limits, unsureReads *float64, unsureBurst *int) {
	d := keyserver.DefaultLimits()
	*limits = d
	f.Float32Var(qps, prefix+"redeem-kube-api-qps", keyserver.DefaultKubeAPIQPS, "requests per second to the apiserver the key server's own client allows itself (redemptions, TokenReviews); it shares no limiter with anything else")
	f.IntVar(burst, prefix+"redeem-kube-api-burst", keyserver.DefaultKubeAPIBurst, "burst above --"+prefix+"redeem-kube-api-qps")
	f.Float64Var(&limits.SourceRate, prefix+"source-rate", d.SourceRate, "requests per second the key server takes from one client address (429 with Retry-After past it)")
	f.IntVar(&limits.SourceBurst, prefix+"source-burst", d.SourceBurst, "requests one client address may send at once above --"+prefix+"source-rate")
	f.IntVar(&limits.SourceConcurrency, prefix+"source-concurrency", d.SourceConcurrency, "requests of one client address the key server serves at the same time")
	f.IntVar(&limits.Sources, prefix+"sources", d.Sources, "client addresses the key server remembers for its limits; past it the least recently heard is forgotten")
	f.IntVar(&limits.Concurrency, prefix+"concurrency", d.Concurrency, "redemptions (and /store-key requests) of all clients together at the apiserver at once; past it they wait for their turn, shared by the namespaces of their tasks")
	f.Float64Var(unsureReads, prefix+"unsure-reads", keyserver.DefaultUnsureReads, "apiserver reads per second of tokens the key index cannot judge while its watch is not current (503 with Retry-After past it)")
	f.IntVar(unsureBurst, prefix+"unsure-burst", keyserver.DefaultUnsureBurst, "burst above --"+prefix+"unsure-reads")
}
