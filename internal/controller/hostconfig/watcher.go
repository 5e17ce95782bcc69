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
)

var configValid = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "berth_config_valid",
	Help: "1 when the latest host-config ConfigMap was valid and is in force, 0 when it was rejected (the last good config stays in force) or none is found.",
})

func init() { metrics.Registry.MustRegister(configValid) }

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
		log.Error(nil, msg)
		for i := range list.Items {
			w.Recorder.Eventf(&list.Items[i], nil, corev1.EventTypeWarning, ReasonAmbiguous, "Validate", msg)
		}
		return reconcile.Result{}, nil
	}

	cm := &list.Items[0]
	if cm.ResourceVersion == w.applied {
		return reconcile.Result{}, nil
	}
	cfg, problems := config.Parse(cm.Data)
	if problems.HasErrors() {
		w.Store.Reject(cfg, problems)
		configValid.Set(0)
		kept := "no config is in force yet, so tasks fail with an error secret naming the setting that breaks their platform"
		if w.Store.Config() != nil {
			kept = "the last good config stays in force"
		}
		msg := fmt.Sprintf("resourceVersion %s: rejected: %d error(s); %s. %s", cm.ResourceVersion, len(problems.Errors()), kept, problems.Summary())
		log.Error(nil, "host-config ConfigMap rejected", "configmap", cm.Name, "resourceVersion", cm.ResourceVersion, "problems", problems.Summary())
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonRejected, "Validate", "%s", truncate(msg))
		w.applied = cm.ResourceVersion
		return reconcile.Result{}, nil
	}

	w.Store.Apply(cfg)
	configValid.Set(1)
	w.applied = cm.ResourceVersion
	log.Info("host-config applied", "configmap", cm.Name, "resourceVersion", cm.ResourceVersion,
		"platforms", len(cfg.Platforms), "hosts", len(cfg.Hosts), "warnings", len(problems))
	w.Recorder.Eventf(cm, nil, corev1.EventTypeNormal, ReasonApplied, "Validate",
		"applied resourceVersion %s: %d platform(s), %d static host(s)", cm.ResourceVersion, len(cfg.Platforms), len(cfg.Hosts))
	if len(problems) > 0 {
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonWarnings, "Validate", "%s", truncate(problems.Summary()))
	}
	w.checkSecrets(ctx, cm, cfg, log)
	return reconcile.Result{}, nil
}

// checkSecrets warns about secrets the config names that do not exist or lack a key: a task
// would otherwise find out only when its provisioning fails.
func (w *Watcher) checkSecrets(ctx context.Context, cm *corev1.ConfigMap, cfg *config.Config, log logr.Logger) {
	for _, problem := range MissingSecrets(ctx, w.APIReader, w.Namespace, cfg) {
		log.Error(nil, "config names a secret that cannot be used", "problem", problem.String())
		w.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, ReasonSecretMissing, "Validate", "%s", problem.String())
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
				problems = append(problems, config.Problem{Severity: config.Warning, Key: ref.ConfigKey,
					Message: fmt.Sprintf("could not read secret %s/%s: %v", namespace, ref.Name, err)})
				continue
			}
			seen[ref.Name] = secret
		}
		if secret == nil {
			problems = append(problems, config.Problem{Severity: config.Warning, Key: ref.ConfigKey,
				Message: fmt.Sprintf("secret %s/%s does not exist; create it with key(s) %s", namespace, ref.Name, strings.Join(ref.Keys, ", "))})
			continue
		}
		for _, k := range ref.Keys {
			if len(secret.Data[k]) == 0 {
				problems = append(problems, config.Problem{Severity: config.Warning, Key: ref.ConfigKey,
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

// truncate keeps an Event's note under the API's 1 KiB limit.
func truncate(s string) string {
	const limit = 1000
	if len(s) <= limit {
		return s
	}
	return s[:limit-3] + "..."
}
