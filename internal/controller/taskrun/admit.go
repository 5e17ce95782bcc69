package taskrun

// The admit phase: a user TaskRun with no record yet is refused, served where it runs, or
// given a record that will hold a host.

import (
	"context"
	"fmt"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// admit decides how the task's platform is served, or why it cannot be.
func (ap *admitPhase) admit(ctx context.Context, tr *pipelinev1.TaskRun) (reconcile.Result, error) {
	a := ap.gate.admission(ap.config.Config(), tr)
	if !a.holdsHost() {
		ap.line.leave(tr) // refused, or served locally: it never takes a slot
	}
	switch {
	case a.reason != "":
		return reconcile.Result{}, ap.secrets.fail(ctx, tr, a.reason, a.message)
	case !a.strategy.holdsHosts():
		return reconcile.Result{}, ap.serveLocally(ctx, tr)
	}
	return ap.reserving.reserve(ctx, tr, ap.records.forTask(tr, a.kind))
}

// admission is how the config in force serves a task's platform, or why it refuses the task.
type admission struct {
	kind     config.Strategy
	strategy strategy
	// reason and message say why the task is refused; reason is "" when it is not.
	reason, message string
}

// holdsHost tells an admitted task that takes a slot of a host.
func (a admission) holdsHost() bool { return a.reason == "" && a.strategy.holdsHosts() }

// gate decides which TaskRuns are berth's to serve, and how (see admission).
type gate struct {
	namespace  string // the controller's
	config     *hostconfig.Store
	strategies strategies
}

// userTaskField indexes the cached TaskRuns that are user tasks (indexUserTasks): what a start
// reads of them, it reads through the index, never by listing every TaskRun of the cluster.
const userTaskField = "berth.dev/user-task"

// indexUserTasks files a user task under "true", and leaves every other TaskRun out of the index.
func (g gate) indexUserTasks(o client.Object) []string {
	if tr, ok := o.(*pipelinev1.TaskRun); ok && g.classify(tr) == userTask {
		return []string{"true"}
	}
	return nil
}

// userTasks lists the cached user tasks through the index. A list that copies its items takes a
// shallow copy of each TaskRun's struct, a kilobyte and more: of every TaskRun of a big cluster
// that would be the controller's peak of memory at start.
var userTasks = client.MatchingFields{userTaskField: "true"}

// classify tells user TaskRuns from the rest. A task-type label makes a TaskRun berth's own
// only in the controller's namespace, where no tenant writes; anywhere else it is ignored.
func (g gate) classify(tr *pipelinev1.TaskRun) kind {
	if tr.Namespace == g.namespace && tr.Labels[contract.TaskTypeLabel] != "" {
		return unrelated
	}
	return classifyUser(tr)
}

// admission decides, from cfg alone (nil: no config in force), whether the task may be served
// and how.
func (g gate) admission(cfg *config.Config, tr *pipelinev1.TaskRun) admission {
	if cfg == nil {
		msg := "berth has no valid host configuration yet, so no platform can be served. Ask the platform team to create or fix the ConfigMap labelled " + contract.ConfigLabel + " in namespace " + g.namespace + "."
		if rejected, _ := g.config.Rejected(); rejected != nil {
			msg = fmt.Sprintf("berth's host configuration cannot be used at all (%s), so no platform can be served until it is fixed in the ConfigMap labelled %s in namespace %s.",
				rejected.Fatal().Summary(), contract.ConfigLabel, g.namespace)
		}
		return admission{reason: "ConfigInvalid", message: msg}
	}
	platform := contract.Platform(tr)
	if !cfg.NamespaceAllowed(tr.Namespace) {
		return admission{reason: "NamespaceNotAllowed", message: fmt.Sprintf(
			"namespace %s may not use multi-platform builds (platform %s): it is not in allowed-namespaces of berth's host configuration. Ask the platform team to allow it.", tr.Namespace, platform)}
	}
	kind, known := cfg.Strategy(config.Platform(platform))
	a := admission{kind: kind, strategy: g.strategies.forKind(kind)}
	switch broken := cfg.Broken(config.Platform(platform)); {
	case !known:
		a.reason, a.message = "UnknownPlatform", fmt.Sprintf(
			"platform %q is not configured: berth serves %s. Fix the PLATFORM param of the task, or ask the platform team to add the platform.", platform, knownPlatforms(cfg))
	case len(broken) > 0:
		a.reason, a.message = "ConfigInvalid", fmt.Sprintf(
			"the host configuration of platform %s is broken, so berth cannot serve it (%s). Ask the platform team to fix it in the ConfigMap labelled %s in namespace %s; `berth config validate` lists every problem.",
			platform, broken.Summary(), contract.ConfigLabel, g.namespace)
	case a.strategy == nil:
		a.reason, a.message = "PlatformUnsupported", fmt.Sprintf(
			"platform %s is configured as %s, which this berth does not serve: use a static host or a local platform for it.", platform, kind)
	}
	return a
}

func knownPlatforms(cfg *config.Config) string {
	var names []string
	for _, p := range cfg.UsablePlatforms() {
		names = append(names, string(p))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// serveLocally tells the task to build where it runs. Nothing is held, so nothing is recorded.
// A platform that names an architecture builds right only on a node of it: its pod must be
// pinned there (the webhook does it when the TaskRun is created), or the task gets an error.
func (ap *admitPhase) serveLocally(ctx context.Context, tr *pipelinev1.TaskRun) error {
	platform := contract.Platform(tr)
	if node, ok := localaffinity.NodeOf(platform); ok && !localaffinity.Enforced(localaffinity.Of(tr), node) {
		err := ap.secrets.fail(ctx, tr, "LocalAffinityMissing", fmt.Sprintf(
			"platform %s is local, so this task builds in its own pod, which must run on a %s/%s node; but the TaskRun's spec.podTemplate does not require %s=%s and %s=%s in every required node selector term, so the pod could run on a node of another architecture and build for it. berth's admission webhook adds that requirement when a TaskRun is created: it was not running when this one was, or the requirement was changed. Re-run the task; if this happens again, ask the platform team to check that berth's webhook is running (MutatingWebhookConfiguration %s).",
			platform, node.OS, node.Arch, corev1.LabelArchStable, node.Arch, corev1.LabelOSStable, node.OS, localaffinity.WebhookName),
			localAffinityMissing.WithLabelValues(platform))
		return err
	}
	if err := ap.secrets.write(ctx, tr, tasksecret.ForLocal(ownerOf(tr))); err != nil {
		return err
	}
	err := ap.mirror.patch(ctx, tr, mirrorState{host: contract.Localhost, platform: platform})
	if err == nil {
		step(ctx, tr.Namespace+"/"+tr.Name, platform, contract.Localhost, "Local", "platform %s is local: the task builds on this cluster", platform)
	}
	return err
}
