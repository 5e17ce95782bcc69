package hostconfig

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/konfluxmetrics"
	"github.com/berth-ci/berth/internal/warning"
)

// DefaultNamespace is where the manifests install the controller, its config and secrets.
const DefaultNamespace = "berth-system"

// ConfigLabel marks the host-config ConfigMap (any value).
const ConfigLabel = contract.ConfigLabel

// Event reasons on the ConfigMap.
const (
	ReasonApplied       = "ConfigApplied"
	ReasonRejected      = "ConfigRejected"
	ReasonWarnings      = "ConfigWarnings"
	ReasonSecretMissing = "SecretMissing"
	ReasonAmbiguous     = "ConfigAmbiguous"
	// ReasonKeptLastGood: an edit broke a platform, host or global key that worked; its last
	// good settings stay in force.
	ReasonKeptLastGood = "ConfigKeptLastGood"
	// ReasonPlatformUnusable: platforms the config lists but cannot be served.
	ReasonPlatformUnusable = "PlatformUnusable"
)

var configValid = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "berth_config_valid",
	Help: "1 when the latest host-config ConfigMap is in force without errors; 0 when it has errors (broken parts keep their last good settings or are unusable), was rejected as a whole, or none is found.",
})

var platformUsable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "berth_platform_usable",
	Help: "Per platform of the config in force: 1 when berth serves it, 0 when its settings are broken and its tasks fail.",
}, []string{"platform"})

func init() { metrics.Registry.MustRegister(configValid, platformUsable) }

// CacheByObject restricts the manager's ConfigMap cache to the config ConfigMap: the cluster's
// other ConfigMaps are none of berth's business.
func CacheByObject(namespace string) map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {
			Namespaces: map[string]cache.Config{namespace: {}},
			Label:      labels.NewSelector().Add(labelExists(ConfigLabel)),
		},
	}
}

// Watcher reconciles the config ConfigMap into a Store.
type Watcher struct {
	Client    client.Client // cached, restricted by CacheByObject
	APIReader client.Reader // uncached, for the secrets the config names
	Namespace string
	Store     *Store
	Recorder  events.EventRecorder

	applied string // resourceVersion last applied or rejected, so resyncs do no work
	stored  []byte // the snapshot last stored in InForceConfigMap
}

// SetupWithManager registers the watcher.
func (w *Watcher) SetupWithManager(mgr ctrl.Manager) error {
	inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == w.Namespace })
	return ctrl.NewControllerManagedBy(mgr).
		Named("hostconfig").
		// Every event maps to one key: the config is judged as a whole, and two labelled
		// ConfigMaps must be noticed together.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: w.Namespace, Name: ConfigLabel}}}
		}), builder.WithPredicates(inNamespace)).
		Complete(w)
}

// Reconcile judges the labelled ConfigMap and puts it in force if it is valid.
func (w *Watcher) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := logr.FromContextOrDiscard(ctx).WithValues("namespace", w.Namespace)
	defer w.Store.MarkSynced()
	var list corev1.ConfigMapList
	if err := w.Client.List(ctx, &list, client.InNamespace(w.Namespace), client.HasLabels{ConfigLabel}); err != nil {
		return reconcile.Result{}, err
	}
	switch len(list.Items) {
	case 0:
		configValid.Set(0)
		w.applied = ""
		w.restoreLastGood(ctx, log)
		if w.Store.Config() == nil {
			log.Info("no host-config ConfigMap found; tasks that need a platform fail with an error secret until one is created", "label", ConfigLabel)
		} else {
			log.Info("the host-config ConfigMap is gone; the last good config stays in force", "label", ConfigLabel)
		}
		return reconcile.Result{}, nil
	case 1:
	default:
		names := make([]string, len(list.Items))
		for i := range list.Items {
			names[i] = list.Items[i].Name
		}
		msg := fmt.Sprintf("%d ConfigMaps carry the label %s (%s); berth applies none of them and keeps the last good config until only one does",
			len(names), ConfigLabel, strings.Join(names, ", "))
		configValid.Set(0)
		w.applied = ""
		w.restoreLastGood(ctx, log)
		warning.Log(log, msg)
		for i := range list.Items {
			w.Recorder.Eventf(&list.Items[i], nil, corev1.EventTypeWarning, ReasonAmbiguous, "Validate", msg)
		}
		return reconcile.Result{}, nil
	}

	cm := &list.Items[0]
	if cm.ResourceVersion == w.applied {
		return reconcile.Result{}, nil
	}
	next, problems := config.Parse(cm.Data)
	if fatal := next.Fatal(); len(fatal) > 0 {
		w.restoreLastGood(ctx, log)
		w.Store.Reject(next, problems)
		configValid.Set(0)
		kept := "no config is in force yet, so every task fails with an error secret saying why"
		if w.Store.Config() != nil {
			kept = "the last good config stays in force"
		}
		msg := fmt.Sprintf("resourceVersion %s: rejected as a whole; %s. %s", cm.ResourceVersion, kept, fatal.Summary())
		warning.Log(log, "host-config ConfigMap rejected", "configmap", cm.Name, "resourceVersion", cm.ResourceVersion, "problems", problems.Summary())
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonRejected, "Validate", "%s", truncate(msg))
		w.applied = cm.ResourceVersion
		return reconcile.Result{}, nil
	}

	cfg, kept := config.Merge(w.lastGood(ctx, log), next)
	w.Store.Apply(cfg)
	w.report(cm, cfg, problems, kept, log)
	w.checkSecrets(ctx, cm, cfg, log)
	if err := w.storeInForce(ctx, cfg); err != nil {
		// Retried: until it is stored, a restart would lose the last good settings.
		return reconcile.Result{}, fmt.Errorf("storing the config in force in %s: %w", InForceConfigMap, err)
	}
	w.applied = cm.ResourceVersion
	return reconcile.Result{}, nil
}

// report says what an applied edit did: the Normal ConfigApplied Event, one Warning per part that
// kept its last good settings (naming the key the edit broke), one for the platforms that cannot
// be served, and one for the remaining problems; and the metrics.
func (w *Watcher) report(cm *corev1.ConfigMap, cfg *config.Config, problems config.Problems, kept []config.Kept, log logr.Logger) {
	rv := cm.ResourceVersion
	keptKeys := map[string]bool{}
	for _, k := range kept {
		for _, p := range k.Problems {
			keptKeys[p.Key] = true
		}
		warning.Log(log, "an edit broke part of the host config; its last good settings stay in force", "part", k.What(), "problems", k.Problems.Summary())
		// The events library folds Events of one object, reason and action into a series that
		// keeps only the first note, so each part gets an action of its own.
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonKeptLastGood, partAction("KeepLastGood", k.What()), "%s", truncate(fmt.Sprintf(
			"resourceVersion %s: %s keeps its last good settings: %s", rv, k.What(), k.Problems.Summary())))
	}
	var unusable []string
	var unusableProblems config.Problems
	platformUsable.Reset()
	report := cfg.Report()
	for _, r := range report {
		value := 1.0
		if !r.Usable {
			value = 0
			unusable = append(unusable, string(r.Platform))
			unusableProblems = append(unusableProblems, cfg.Broken(r.Platform)...)
		}
		platformUsable.WithLabelValues(string(r.Platform)).Set(value)
	}
	konfluxmetrics.ServePlatforms(konfluxmetrics.PoolSizes(report))
	if len(unusable) > 0 {
		warning.Log(log, "platforms cannot be served; their tasks fail with an error secret", "platforms", unusable, "problems", unusableProblems.Summary())
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonPlatformUnusable, "Validate", "%s", truncate(fmt.Sprintf(
			"resourceVersion %s: %d platform(s) cannot be served and their tasks fail (%s): %s", rv, len(unusable), strings.Join(unusable, ", "), unusableProblems.Summary())))
	}
	var rest config.Problems
	for _, p := range problems {
		if !keptKeys[p.Key] && (p.Platform == "" || cfg.Usable(p.Platform)) {
			rest = append(rest, p)
		}
	}
	if len(unusable) == 0 && len(kept) == 0 && !problems.HasErrors() {
		configValid.Set(1)
	} else {
		configValid.Set(0)
	}
	log.Info("host-config applied", "configmap", cm.Name, "resourceVersion", rv,
		"platforms", len(cfg.Platforms), "unusable", len(unusable), "kept", len(kept), "hosts", len(cfg.Hosts), "problems", len(problems))
	w.Recorder.Eventf(cm, nil, corev1.EventTypeNormal, ReasonApplied, "Validate",
		"applied resourceVersion %s: %d of %d platform(s) usable, %d static host(s)", rv, len(cfg.Platforms)-len(unusable), len(cfg.Platforms), len(cfg.Hosts))
	if len(rest) > 0 {
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonWarnings, "Validate", "%s", truncate(fmt.Sprintf("resourceVersion %s: %s", rv, rest.Summary())))
	}
}

// checkSecrets warns about secrets the config names that do not exist or lack a key: a task
// would otherwise find out only when its provisioning fails.
func (w *Watcher) checkSecrets(ctx context.Context, cm *corev1.ConfigMap, cfg *config.Config, log logr.Logger) {
	for _, problem := range MissingSecrets(ctx, w.APIReader, w.Namespace, cfg) {
		warning.Log(log, "config names a secret that cannot be used", "problem", problem.String())
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonSecretMissing, partAction("CheckSecret", problem.Key), "%s", problem.String())
	}
}

// MissingSecrets returns a warning for each secret cfg names that does not exist in namespace
// or lacks a key berth needs.
func MissingSecrets(ctx context.Context, r client.Reader, namespace string, cfg *config.Config) config.Problems {
	var problems config.Problems
	seen := map[string]*corev1.Secret{}
	for _, ref := range cfg.Secrets() {
		secret, ok := seen[ref.Name]
		if !ok {
			secret = &corev1.Secret{}
			err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, secret)
			switch {
			case apierrors.IsNotFound(err):
				secret = nil
			case err != nil:
				problems = append(problems, config.Problem{Severity: config.Warning, Platform: ref.Platform, Key: ref.ConfigKey,
					Message: fmt.Sprintf("could not read secret %s/%s: %v", namespace, ref.Name, err)})
				continue
			}
			seen[ref.Name] = secret
		}
		if secret == nil {
			problems = append(problems, config.Problem{Severity: config.Warning, Platform: ref.Platform, Key: ref.ConfigKey,
				Message: fmt.Sprintf("secret %s/%s does not exist; create it with key(s) %s", namespace, ref.Name, strings.Join(ref.Keys, ", "))})
			continue
		}
		for _, k := range ref.Keys {
			if len(secret.Data[k]) == 0 {
				problems = append(problems, config.Problem{Severity: config.Warning, Platform: ref.Platform, Key: ref.ConfigKey,
					Message: fmt.Sprintf("secret %s/%s has no key %s", namespace, ref.Name, k)})
			}
		}
	}
	return problems
}

func labelExists(key string) labels.Requirement {
	r, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		panic(err) // only for a malformed constant
	}
	return *r
}

// partAction is an Event action naming the part of the config it is about (at most the API's 128
// characters), so that Events about different parts are never folded into one series.
func partAction(verb, part string) string {
	a := verb + " " + part
	if len(a) > 128 {
		a = a[:128]
	}
	return a
}

// truncate keeps an Event's note under the API's 1 KiB limit.
func truncate(s string) string {
	const limit = 1000
	if len(s) <= limit {
		return s
	}
	return s[:limit-3] + "..."
}
