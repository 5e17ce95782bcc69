// Package webhook is berth's admission webhook, served by the controller: on TaskRun CREATE it
// pins a task on a local platform to nodes of the platform's architecture and OS (package
// localaffinity), because Tekton creates the task's pod from the TaskRun as soon as it exists,
// before berth could patch anything. It never refuses a TaskRun: on any failure it admits the
// TaskRun as it came, counts it, and leaves the controller to answer such a task with an error
// instead of localhost.
package webhook

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/localaffinity"
)

// How config/webhook registers the webhook: the MutatingWebhookConfiguration's name, and the
// path it is served at.
const (
	ConfigurationName = localaffinity.WebhookName
	AffinityPath      = "/mutate-tekton-dev-v1-taskrun-platform-affinity"
)

// Outcomes of a request, the values of berth_affinity_webhook_requests_total's label.
const (
	OutcomePinned    = "pinned"    // the requirement was added
	OutcomeUnchanged = "unchanged" // not a local platform that names a node, or pinned already
	OutcomeNoConfig  = "no-config" // no config in force to tell local platforms by
	OutcomeError     = "error"     // admitted unchanged for want of an answer
)

var requests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "berth_affinity_webhook_requests_total",
	Help: "TaskRun creations the platform-affinity webhook answered, by outcome: pinned, unchanged, no-config, error (admitted unchanged; the controller then answers a local-platform task with an error).",
}, []string{"outcome"})

func init() { metrics.Registry.MustRegister(requests) }

// ConfigSource is the host config in force, nil if there is none yet.
type ConfigSource func(context.Context) (*config.Config, error)

// Affinity is the webhook's handler.
type Affinity struct {
	Config ConfigSource
}

// Handle pins a TaskRun whose PLATFORM is a local platform naming os/arch, from its params
// alone (at CREATE Tekton has not resolved its task yet).
func (a *Affinity) Handle(ctx context.Context, req admission.Request) (resp admission.Response) {
	log := logf.FromContext(ctx)
	outcome := OutcomeUnchanged
	defer func() {
		// A panic answered as controller-runtime would (an error) would refuse the TaskRun:
		// failurePolicy only covers a webhook that cannot be reached.
		if r := recover(); r != nil {
			log.Error(fmt.Errorf("%v", r), "platform-affinity webhook panicked; admitting the TaskRun unchanged")
			outcome, resp = OutcomeError, admission.Allowed("")
		}
		requests.WithLabelValues(outcome).Inc()
	}()
	var tr pipelinev1.TaskRun
	if err := json.Unmarshal(req.Object.Raw, &tr); err != nil {
		log.Error(err, "cannot read the TaskRun; admitting it unchanged")
		outcome = OutcomeError
		return admission.Allowed("")
	}
	platform := contract.Platform(&tr)
	node, ok := localaffinity.NodeOf(platform)
	if !ok {
		return admission.Allowed("")
	}
	cfg, err := a.Config(ctx)
	if err != nil {
		log.Error(err, "cannot read berth's host config; admitting the TaskRun unchanged", "platform", platform)
		outcome = OutcomeError
		return admission.Allowed("")
	}
	if cfg == nil {
		outcome = OutcomeNoConfig
		return admission.Allowed("")
	}
	if kind, known := cfg.Strategy(config.Platform(platform)); !known || kind != config.StrategyLocal {
		return admission.Allowed("")
	}
	current := localaffinity.Of(&tr)
	if localaffinity.Enforced(current, node) {
		return admission.Allowed("")
	}
	outcome = OutcomePinned
	return admission.Patched(fmt.Sprintf("platform %s is local: pinned to %s/%s nodes", platform, node.OS, node.Arch),
		patch(&tr, localaffinity.Require(current, node)))
}

// patch sets the TaskRun's spec.podTemplate.affinity.nodeAffinity to na, adding the objects
// above it that are missing. Only that one member is written, so that every other field of the
// TaskRun (the pod template's others, pod (anti-)affinity, fields of a newer Tekton than the
// types berth knows) reaches the apiserver exactly as it came. An "add" of a member that
// exists (or is null) replaces it.
func patch(tr *pipelinev1.TaskRun, na *corev1.NodeAffinity) jsonpatch.JsonPatchOperation {
	pt := tr.Spec.PodTemplate
	switch {
	case pt == nil:
		return jsonpatch.NewOperation("add", "/spec/podTemplate", map[string]any{"affinity": map[string]any{"nodeAffinity": na}})
	case pt.Affinity == nil:
		return jsonpatch.NewOperation("add", "/spec/podTemplate/affinity", map[string]any{"nodeAffinity": na})
	default:
		return jsonpatch.NewOperation("add", "/spec/podTemplate/affinity/nodeAffinity", na)
	}
}

// InForce is the config the controller holds in store or, while that is empty, the one
// hostconfig.Read finds through r. The store is filled by the config watcher, which runs on the
// leader only; every replica serves the webhook (the Service picks any ready one, during a
// rollout the new pod before it leads), so the others read the config as `berth status` does.
func InForce(store *hostconfig.Store, r client.Reader, namespace string) ConfigSource {
	return func(ctx context.Context) (*config.Config, error) {
		if cfg := store.Config(); cfg != nil {
			return cfg, nil
		}
		return hostconfig.Read(ctx, r, namespace)
	}
}
