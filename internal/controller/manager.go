// Package controller assembles berth's controller: a controller-runtime manager with the
// host-config watcher, the TaskRun reconciler and the leader-only host checks.
package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/adminkeys"
	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/hostkeys"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/kubescheme"
	"github.com/berth-ci/berth/internal/otp/keyserver"
	"github.com/berth-ci/berth/internal/provision"
	"github.com/berth-ci/berth/internal/remote"
	"github.com/berth-ci/berth/internal/webhook"
)

// Options configure the controller; the defaults are those of `berth controller`.
type Options struct {
	Namespace          string
	MetricsAddress     string // "0" disables
	HealthProbeAddress string // "0" disables
	PprofAddress       string // net/http/pprof's /debug/pprof/; "" or "0" disables
	LeaderElection     bool
	LeaderElectionID   string
	// ConcurrentReconciles bounds the TaskRuns reconciled at once. A reconcile spends its time
	// waiting on the apiserver as a host job waits on SSH, so the default is SSHWorkers' (32):
	// with 10, a burst of 2,000 tasks waited in berth's work queue for 20 s and more while the
	// machine had room for them (docs/task-cost.md).
	ConcurrentReconciles int
	// GCPercent is Go's GC percent for the process (see useGCPercent); 0 leaves the runtime's.
	GCPercent int
	// MaxProcs is how many processors run the process's Go code at once (see setMaxProcs); 0
	// leaves the runtime's.
	MaxProcs            int
	WaitTimeout         time.Duration
	FailedTaskRetention time.Duration
	HostCheckInterval   time.Duration
	ProvisionTask       string
	CleanTask           string
	UpdateTask          string
	TaskServiceAccount  string
	// MetricsSecure serves /metrics over HTTPS to authenticated clients allowed to get it (see
	// metricsOptions); false serves it to anyone over plain HTTP.
	MetricsSecure bool
	// MetricsCertDir holds the metrics' tls.crt and tls.key (reloaded when they change); ""
	// gives a self-signed certificate made at start (controller-runtime's, which takes one from
	// <tmp>/k8s-metrics-server/serving-certs instead if that holds one).
	MetricsCertDir string
	// MetricsReviewQPS and MetricsReviewBurst are the budget of TokenReviews and
	// SubjectAccessReviews the metrics filter may make (zero: 2 a second, 10 at once); past it a
	// scrape with a token not seen before is answered 429.
	MetricsReviewQPS   float32
	MetricsReviewBurst int
	// UpstreamNamespace is where the controller berth replaces ran: its provision TaskRuns
	// there are what the switch-over's adoption believes (see taskrun.Reconciler).
	UpstreamNamespace string
	// Provisioner is how hosts are worked on: "ssh" (the controller itself) or "taskrun"
	// (internal TaskRuns, for clusters where only pods may reach hosts).
	Provisioner string
	// SSHWorkers bounds host jobs running at once in the ssh provisioner.
	SSHWorkers int
	// MinFreeBytes below which a host check fails.
	MinFreeBytes uint64
	// MirrorRevertInterval is how often at most a tenant's edit of berth's labels on one
	// TaskRun is reverted (1 minute when zero), so an edit loop cannot drive unbounded writes.
	MirrorRevertInterval time.Duration
	// SweepInterval is how often the clouds are listed for leaked instances; LeakGrace how old
	// an instance without a record must be to be terminated as one.
	SweepInterval time.Duration
	LeakGrace     time.Duration
	// VMPlanInterval is the longest the VM planner waits between passes (5s when zero).
	VMPlanInterval time.Duration
	// QueuePositionInterval is the least time between two writes of a waiting TaskRun's
	// berth.dev/queue-position annotation (10s when zero).
	QueuePositionInterval time.Duration
	// Clock, if set, is the VM fleet's clock (max-age, allocation timeouts): tests move it.
	Clock func() time.Time
	// WebhookPort is where the admission webhook that pins local-platform TaskRuns to nodes of
	// their architecture is served over TLS (package webhook); 0 serves none. WebhookHost is
	// the address it binds ("": all), WebhookCertDir holds its tls.crt and tls.key (reloaded
	// when they change, as a mounted Secret is).
	WebhookPort    int
	WebhookHost    string
	WebhookCertDir string
	// Restartable allows a later manager in the same process (a test or the dev stack
	// replacing a stopped controller); controller-runtime otherwise refuses repeated names.
	Restartable bool
	// OTP is the one-time-password option: tasks get a token for their key, not the key.
	OTP OTPOptions
}

// OTPOptions turn on the one-time-password key hand-over (docs/otp.md). ServerURL switches the
// task secrets to the OTP shape; BindAddress serves the key server in the controller. Either
// can go without the other: the server can run alone (`berth otp-server`), and a controller
// serving only redemptions of keys it no longer writes lets those still in flight be redeemed.
type OTPOptions struct {
	// ServerURL is the full URL tasks POST their token to, /otp included (otp-server); "" gives
	// tasks their key in the secret, as without the option.
	ServerURL string
	// CAFile is the CA certificate written into task secrets (otp-ca); CertDir's ca.crt when
	// empty.
	CAFile string
	// BindAddress serves the key server in the controller (HTTPS); "" or "0" does not.
	BindAddress string
	// CertDir holds the server's tls.crt, tls.key and ca.crt, as a cert-manager Certificate's
	// Secret mounted as a volume; they are read again when they change.
	CertDir string
	// KeyTTL is how long a key is kept for redemption (keyserver.DefaultTTL when zero).
	KeyTTL time.Duration
	// StoreKeyServiceAccounts ("namespace/name") may POST /store-key; none: nobody may.
	StoreKeyServiceAccounts []string
	// KubeAPIQPS and KubeAPIBurst limit the key server's own apiserver client: redemptions
	// never share the controller's client or its limiter (keyserver defaults when zero).
	KubeAPIQPS   float32
	KubeAPIBurst int
	// Limits bound each source's requests and all of them together (keyserver.DefaultLimits
	// for zero fields).
	Limits keyserver.Limits
	// UnsureReads and UnsureBurst bound the apiserver reads of tokens the key index cannot
	// judge while its watch is not current (keyserver defaults when zero).
	UnsureReads float64
	UnsureBurst int
}

func (o OTPOptions) serves() bool { return o.BindAddress != "" && o.BindAddress != "0" }

// caFile is where the CA written into task secrets is read.
func (o OTPOptions) caFile() string {
	if o.CAFile != "" {
		return o.CAFile
	}
	return filepath.Join(o.CertDir, keyserver.CAFile)
}

// check refuses settings that would only fail later, task by task.
func (o OTPOptions) check() error {
	if o.ServerURL != "" {
		u, err := url.Parse(o.ServerURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("--otp-server-url=%q: want the full https:// URL tasks POST their token to, /otp included", o.ServerURL)
		}
		if o.CAFile == "" && o.CertDir == "" {
			return errors.New("--otp-server-url needs the CA of the server's certificate for the task secrets: --otp-ca-file or --otp-cert-dir")
		}
		if _, err := keyserver.ReadCA(o.caFile()); err != nil {
			return err
		}
	}
	if o.serves() && o.CertDir == "" {
		return errors.New("--otp-bind-address needs --otp-cert-dir (tls.crt, tls.key)")
	}
	return nil
}

// keyStockSize is how many RSA keys the controller keeps made ahead when the config asks for
// rsa-3072: a burst of that many tasks finds its keys ready (refilling takes a few hundred
// milliseconds of CPU per key).
const keyStockSize = 16

// DefaultOptions are what a platform team gets without flags.
func DefaultOptions() Options {
	return Options{
		Namespace:            hostconfig.DefaultNamespace,
		MetricsAddress:       ":8080",
		MetricsSecure:        true,
		HealthProbeAddress:   ":8081",
		LeaderElectionID:     "berth-controller",
		ConcurrentReconciles: 32,
		WaitTimeout:          time.Hour,
		FailedTaskRetention:  10 * time.Minute,
		HostCheckInterval:    10 * time.Minute,
		ProvisionTask:        "provision-shared-host",
		CleanTask:            "clean-shared-host",
		UpdateTask:           "update-host",
		TaskServiceAccount:   "berth-host-tasks",
		Provisioner:          "ssh",
		UpstreamNamespace:    taskrun.DefaultUpstreamNamespace,
		SSHWorkers:           32,
		MinFreeBytes:         10 << 30,
		SweepInterval:        time.Minute,
		LeakGrace:            10 * time.Minute,
		WebhookPort:          9443,
		WebhookCertDir:       filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs"),
	}
}

// New builds the manager; Start it to run the controller.
func New(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if err := o.OTP.check(); err != nil {
		return nil, err
	}
	metrics, err := metricsOptions(o)
	if err != nil {
		return nil, err
	}
	opts := ctrl.Options{
		Scheme:                  kubescheme.New(),
		MapperProvider:          kubescheme.NewMapper,
		Cache:                   taskrun.CacheOptions(o.Namespace),
		Metrics:                 metrics,
		HealthProbeBindAddress:  o.HealthProbeAddress,
		PprofBindAddress:        o.PprofAddress,
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.Namespace,
		// A new leader rebuilds its ledger from labels; stepping down at once on shutdown
		// lets it take over without waiting for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		Controller:                    ctrlconfig.Controller{SkipNameValidation: &o.Restartable},
	}
	if o.WebhookPort != 0 {
		if err := servingCertificateIn(o.WebhookCertDir); err != nil {
			return nil, err
		}
		opts.WebhookServer = crwebhook.NewServer(crwebhook.Options{Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.WebhookCertDir,
			// HTTP/1.1 only: anything in the cluster can reach the port, and HTTP/2's stream
			// handling has been a denial-of-service target (CVE-2023-44487); the apiserver
			// calls webhooks over HTTP/1.1 just as well.
			TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}})
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	setMaxProcs(o.MaxProcs)
	if err := useGCPercent(mgr, o.GCPercent); err != nil {
		return nil, err
	}
	store := hostconfig.NewStore()
	recorder, err := newEventRecorder(mgr, "berth")
	if err != nil {
		return nil, err
	}
	watcher := &hostconfig.Watcher{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: o.Namespace, Store: store, Recorder: recorder}
	if err := watcher.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	// RSA keys are made ahead, off the reconcile that reserves a slot (see KeyStock).
	keys := hostops.NewKeyStock(keyStockSize)
	store.OnChange(func(cfg *config.Config) { keys.Prepare(cfg.UserKeyType) })
	// One ledger of what berth can hand out, with its wake-ups, for the task controller and
	// the hosts' owner alike.
	slots := capacity.New()
	slots.Publish()
	reconciler := &taskrun.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: o.Namespace, Config: store,
		Capacity: slots, Recorder: recorder, NewKey: keys.NewKey,
		WaitTimeout: o.WaitTimeout, MirrorRevertInterval: o.MirrorRevertInterval,
		PositionInterval: o.QueuePositionInterval, UpstreamNamespace: o.UpstreamNamespace,
	}
	uncached, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, err
	}
	if err := setupOTP(mgr, uncached, reconciler, o); err != nil {
		return nil, err
	}
	adminKeys, err := adminKeysOf(mgr, o.Namespace)
	if err != nil {
		return nil, err
	}
	switch o.Provisioner {
	case "ssh", "":
		reconciler.Provisioner = provision.NewSSH(provision.Hostops{MinFreeBytes: o.MinFreeBytes}, adminKeys.Signer,
			hostKeysOf(hostkeys.Store{Client: uncached, Namespace: o.Namespace}),
			o.SSHWorkers, slots.Notify)
	case "taskrun":
		reconciler.Provisioner = &provision.TaskRuns{Client: mgr.GetClient(), Namespace: o.Namespace,
			ProvisionTask: o.ProvisionTask, CleanTask: o.CleanTask, UpdateTask: o.UpdateTask, ServiceAccount: o.TaskServiceAccount}
	default:
		return nil, fmt.Errorf("--provisioner=%q: want ssh or taskrun", o.Provisioner)
	}
	owner := &hosts.Owner{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: o.Namespace, Config: store,
		Capacity: slots, Recorder: recorder, Debts: reconciler,
		Checker: reconciler.Provisioner, CheckInterval: o.HostCheckInterval,
		Prober:        hosts.SSHProber{AdminKey: adminKeys.Signer},
		Secret:        secretReader(mgr.GetAPIReader(), o.Namespace),
		SweepInterval: o.SweepInterval, LeakGrace: o.LeakGrace, PlanInterval: o.VMPlanInterval, Now: o.Clock,
	}
	if o.HostCheckInterval > 0 {
		// Only checks lift a quarantine: without them, none is imposed for failing cleans.
		owner.QuarantineAfterCleanFailures = 3
	}
	reconciler.Hosts = owner
	if err := reconciler.SetupWithManager(mgr, o.ConcurrentReconciles); err != nil {
		return nil, err
	}
	if err := owner.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if o.WebhookPort != 0 {
		server := mgr.GetWebhookServer()
		server.Register(webhook.AffinityPath, &admission.Webhook{Handler: &webhook.Affinity{Config: webhook.InForce(store, mgr.GetAPIReader(), o.Namespace)}})
		// Ready only once the webhook answers: the Service sends the apiserver's calls to
		// ready pods alone.
		if err := mgr.AddReadyzCheck("webhook", server.StartedChecker()); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// setupOTP wires the one-time-password option. The sweeper runs whether or not the option is
// on now: keys kept while it was on are deleted once they can no longer be redeemed.
func setupOTP(mgr ctrl.Manager, uncached client.Client, reconciler *taskrun.Reconciler, o Options) error {
	keys := &keyserver.Store{Client: uncached, Namespace: o.Namespace, TTL: o.OTP.KeyTTL,
		Attempts: taskrun.CachedAttempts{Cache: mgr.GetCache(), Namespace: o.Namespace}}
	if err := mgr.Add(keyserver.Sweeper{Store: keys}); err != nil {
		return err
	}
	if o.OTP.ServerURL != "" {
		caFile := o.OTP.caFile()
		reconciler.OTP = &taskrun.OneTimeKeys{Keys: keys, URL: o.OTP.ServerURL,
			CA: func() ([]byte, error) { return keyserver.ReadCA(caFile) }}
	}
	if !o.OTP.serves() {
		return nil
	}
	return keyserver.Serve(mgr, keys, keyserver.ServeOptions{Addr: o.OTP.BindAddress, CertDir: o.OTP.CertDir,
		StoreKeyServiceAccounts: o.OTP.StoreKeyServiceAccounts, KubeAPIQPS: o.OTP.KubeAPIQPS, KubeAPIBurst: o.OTP.KubeAPIBurst,
		Limits: o.OTP.Limits, UnsureReads: o.OTP.UnsureReads, UnsureBurst: o.OTP.UnsureBurst})
}

// servingCertificateIn checks that dir holds the webhook's certificate and key, so that a
// controller without them says so at once instead of failing when its webhook starts.
func servingCertificateIn(dir string) error {
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("the webhook's serving certificate: %w; mount its Secret (berth-webhook-tls, see docs/webhook.md) at --webhook-cert-dir, or pass --webhook-port=0 to serve no webhook", err)
		}
	}
	return nil
}

// adminKeysOf holds the admin keys of berth's namespace (adminkeys), with a watch of that
// namespace's Secrets' metadata of its own: the manager's Secret cache holds berth's labelled
// Secrets alone, and no Secret's data.
func adminKeysOf(mgr ctrl.Manager, namespace string) (*adminkeys.Keys, error) {
	// The one-time keys kept there, one per task (docs/otp.md), are no admin keys: left out,
	// so that the watch holds only the Secrets the installation made.
	notOneTimeKeys, err := labels.Parse("!" + keyserver.KeyLabel)
	if err != nil {
		return nil, err
	}
	versions, err := cache.New(mgr.GetConfig(), cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{namespace: {}}, DefaultLabelSelector: notOneTimeKeys})
	if err != nil {
		return nil, err
	}
	// The informer is asked for now so that it starts, and syncs, with the manager.
	if _, err := versions.GetInformer(context.Background(), adminkeys.SecretMeta()); err != nil {
		return nil, err
	}
	if err := mgr.Add(versions); err != nil {
		return nil, err
	}
	return &adminkeys.Keys{Versions: versions, Secrets: mgr.GetAPIReader(), Namespace: namespace}, nil
}

// secretReader reads a Secret of the controller's namespace when a cloud call needs its
// credentials, past the cache.
func secretReader(r client.Reader, namespace string) cloud.SecretReader {
	return func(ctx context.Context, name string) (map[string][]byte, error) {
		var s corev1.Secret
		err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s)
		switch {
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("%w: %v", cloud.ErrNoSecret, err)
		case apierrors.IsForbidden(err):
			return nil, fmt.Errorf("%w: %v", cloud.ErrSecretForbidden, err)
		case err != nil:
			return nil, err
		}
		return s.Data, nil
	}
}

// hostKeysOf accepts a host's pinned key, or else the key recorded at first contact.
func hostKeysOf(known hostkeys.Store) func(berthv1.HostLogin) (remote.HostKeys, error) {
	return func(login berthv1.HostLogin) (remote.HostKeys, error) {
		if login.HostKey != "" {
			pinned, err := remote.ParsePinned(login.HostKey)
			if err != nil {
				return nil, fmt.Errorf("host %s: pinned host key: %w", login.Host, err)
			}
			return pinned, nil
		}
		return remote.TrustOnFirstUse{Store: known}, nil
	}
}
