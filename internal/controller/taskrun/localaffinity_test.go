//go:build stack

package taskrun_test

import (
	"context"
	"strings"
	"testing"

	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/webhook"
)

// The local platforms of these tests: linux/x86_64 as production configs spell it, an arm64
// one, and the names that mean "this cluster, any node".
const localPlatforms = "linux/amd64,linux/x86_64,linux/arm64,local,localhost"

func applyLocalConfig(t *testing.T) {
	t.Helper()
	applyConfig(t, 2, map[string]string{"local-platforms": localPlatforms})
}

func term(exprs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: exprs}
}

func in(key string, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
}

func requiredTerms(terms ...corev1.NodeSelectorTerm) *corev1.NodeAffinity {
	return &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}
}

var (
	archAMD64 = in(corev1.LabelArchStable, "amd64")
	archARM64 = in(corev1.LabelArchStable, "arm64")
	osLinux   = in(corev1.LabelOSStable, "linux")
	zoneA     = in(corev1.LabelTopologyZone, "zone-a")
	twoArches = in(corev1.LabelArchStable, "amd64", "arm64")
)

// withPodTemplate gives a TaskRun a pod template of its own.
func withPodTemplate(tr *pipelinev1.TaskRun, pt *pod.Template) *pipelinev1.TaskRun {
	tr.Spec.PodTemplate = pt
	return tr
}

// podOf waits for the pod the Tekton stand-in makes for the TaskRun, from its spec as Tekton
// does.
func podOf(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	eventually(t, "the pod of "+tr.Name+" exists", func() (bool, error) {
		now := get(t, tr)
		if now.Status.PodName == "" {
			return false, nil
		}
		err := c().Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: now.Status.PodName}, &p)
		return err == nil, client.IgnoreNotFound(err)
	})
	return &p
}

// servedLocally waits for the task's secret and checks that it says localhost.
func servedLocally(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	s := secretOf(t, tr)
	if string(s.Data["host"]) != contract.Localhost {
		t.Errorf("%s: secret %v, want host=localhost (error: %s)", tr.Name, keys(s), s.Data["error"])
	}
}

func keys(s *corev1.Secret) []string {
	var out []string
	for k := range s.Data {
		out = append(out, k)
	}
	return out
}

// A TaskRun on a local platform that names an architecture is pinned to nodes of it when it
// is created, and so is its pod; the affinity it brings is kept and narrowed, never widened;
// every other TaskRun is left as it came.
func TestLocalPlatformTaskRunsArePinnedToTheirArchitecture(t *testing.T) {
	applyLocalConfig(t)
	ns := namespace(t)
	preferred := []corev1.PreferredSchedulingTerm{{Weight: 10, Preference: term(in(corev1.LabelTopologyZone, "zone-b"))}}
	antiAffinity := &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
		Weight: 5, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname}}}}
	own := func(na *corev1.NodeAffinity) *pod.Template {
		return &pod.Template{
			NodeSelector: map[string]string{"disk": "ssd"},
			Affinity:     &corev1.Affinity{NodeAffinity: na, PodAntiAffinity: antiAffinity.DeepCopy()},
		}
	}
	withPreferred := func(na *corev1.NodeAffinity) *corev1.NodeAffinity {
		na.PreferredDuringSchedulingIgnoredDuringExecution = preferred
		return na
	}
	for _, tc := range []struct {
		name     string
		platform string
		template *pod.Template
		want     *corev1.NodeAffinity
	}{
		{"x86", "linux/x86_64", nil, requiredTerms(term(archAMD64, osLinux))},
		{"arm", "linux/arm64", own(nil), requiredTerms(term(archARM64, osLinux))},
		// Terms are alternatives: each gets the requirement, or a node matching the one
		// without it would do. A term that allowed two arches allows one.
		{"merged", "linux/arm64", own(withPreferred(requiredTerms(term(zoneA), term(twoArches)))),
			withPreferred(requiredTerms(term(zoneA, archARM64, osLinux), term(twoArches, archARM64, osLinux)))},
		// A tenant's term for another architecture: the pod matches no node, never a wrong one.
		{"conflicting", "linux/x86_64", own(requiredTerms(term(archARM64))), requiredTerms(term(archARM64, archAMD64, osLinux))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := create(t, withPodTemplate(userTaskRun(ns, tc.name, tc.platform, ""), tc.template))
			node, _ := localaffinity.NodeOf(tc.platform)
			created := get(t, tr)
			pt := created.Spec.PodTemplate
			if pt == nil || pt.Affinity == nil || !equality.Semantic.DeepEqual(pt.Affinity.NodeAffinity, tc.want) {
				t.Fatalf("spec.podTemplate as created: %+v\nwant node affinity %+v", pt, tc.want)
			}
			if !localaffinity.Enforced(pt.Affinity.NodeAffinity, node) {
				t.Errorf("the node affinity does not pin %s/%s: %+v", node.OS, node.Arch, pt.Affinity.NodeAffinity)
			}
			if tc.template != nil {
				if !equality.Semantic.DeepEqual(pt.Affinity.PodAntiAffinity, antiAffinity) || pt.NodeSelector["disk"] != "ssd" {
					t.Errorf("the rest of the pod template changed: %+v", pt)
				}
			}
			if p := podOf(t, tr); !equality.Semantic.DeepEqual(p.Spec.Affinity, pt.Affinity) {
				t.Errorf("the pod's affinity %+v, not its TaskRun's %+v", p.Spec.Affinity, pt.Affinity)
			}
			servedLocally(t, tr)
		})
	}

	t.Run("untouched", func(t *testing.T) {
		antiOnly := &pod.Template{Affinity: &corev1.Affinity{PodAntiAffinity: antiAffinity.DeepCopy()}}
		remote := create(t, withPodTemplate(userTaskRun(ns, "remote", platform, ""), antiOnly.DeepCopy()))
		local := create(t, userTaskRun(ns, "local", "local", ""))
		localhost := create(t, userTaskRun(ns, "localhost", "localhost", ""))
		unknown := create(t, userTaskRun(ns, "unknown", "linux/riscv64", ""))
		if pt := get(t, remote).Spec.PodTemplate; !equality.Semantic.DeepEqual(pt, antiOnly) {
			t.Errorf("the pod template of a task on static platform %s changed: %+v", platform, pt)
		}
		for _, tr := range []*pipelinev1.TaskRun{local, localhost, unknown} {
			if pt := get(t, tr).Spec.PodTemplate; pt != nil {
				t.Errorf("%s got a pod template: %+v", tr.Name, pt)
			}
		}
		servedLocally(t, local)
		servedLocally(t, localhost)
		if s := secretOf(t, unknown); !strings.Contains(string(s.Data["error"]), "not configured") {
			t.Errorf("a task on an unknown platform: secret %v, error %q", keys(s), s.Data["error"])
		}
		if s := secretOf(t, remote); !strings.Contains(string(s.Data["host"]), "@") {
			t.Errorf("the static task was not served a host: secret %v, error %q", keys(s), s.Data["error"])
		}
		finish(t, remote)
		eventually(t, "the static task's record is gone", func() (bool, error) {
			err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(remote.UID)}, &berthv1.Allocation{})
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
	})
}

// A TaskRun created while no webhook answers is still created (failurePolicy Ignore); berth
// then answers it with an error, an Event and a metric, never localhost: its pod could run on
// a node of any architecture. That holds for a controller that serves no webhook, for one that
// was down when the TaskRun was created, and for a tenant's own affinity that allows other
// architectures too. Once the webhook serves again, new TaskRuns are pinned and served.
func TestWithoutTheWebhookLocalTasksGetAnError(t *testing.T) {
	applyLocalConfig(t)
	ns := namespace(t)
	noWebhook := controllerOptions()
	noWebhook.WebhookPort = 0
	restartController(t, noWebhook)
	defer restartController(t, controllerOptions())
	before := max(0, metricValue("berth_local_affinity_missing_total", "platform", "linux/x86_64"))

	unpinned := create(t, userTaskRun(ns, "unpinned", "linux/x86_64", ""))
	// The tenant's own attempt: amd64 is allowed, and so is arm64.
	lax := create(t, withPodTemplate(userTaskRun(ns, "lax", "linux/x86_64", ""),
		&pod.Template{Affinity: &corev1.Affinity{NodeAffinity: requiredTerms(term(twoArches, osLinux))}}))
	// Both answered, and told so, before the stop: Events are written in the background, and
	// one still on its way when the controller stops is dropped (Events are best effort).
	for _, tr := range []*pipelinev1.TaskRun{unpinned, lax} {
		secretOf(t, tr)
		eventually(t, "a LocalAffinityMissing warning on "+tr.Name, func() (bool, error) {
			return warnedOn(tr, "LocalAffinityMissing")
		})
	}
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	down := create(t, userTaskRun(ns, "down", "linux/x86_64", ""))
	if err := startController(controllerOptions()); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*pipelinev1.TaskRun{unpinned, lax, down} {
		s := secretOf(t, tr)
		msg := string(s.Data["error"])
		if _, host := s.Data["host"]; host || !strings.Contains(msg, "webhook") || !strings.Contains(msg, "Re-run") ||
			!strings.Contains(msg, "kubernetes.io/arch=amd64") {
			t.Errorf("%s: secret %v with error %q; want an error naming the missing requirement and the webhook", tr.Name, keys(s), msg)
		}
		eventually(t, "a LocalAffinityMissing warning on "+tr.Name, func() (bool, error) {
			return warnedOn(tr, "LocalAffinityMissing")
		})
	}
	// The count follows the TaskRun's patch, which comes after the Event: wait for it.
	var got float64
	eventually(t, "berth_local_affinity_missing_total to count the three", func() (bool, error) {
		got = metricValue("berth_local_affinity_missing_total", "platform", "linux/x86_64")
		return got >= before+3, nil
	})
	if got != before+3 {
		t.Errorf("berth_local_affinity_missing_total{platform=linux/x86_64} = %v, want %v", got, before+3)
	}

	after := create(t, userTaskRun(ns, "after", "linux/x86_64", ""))
	if !localaffinity.Enforced(localaffinity.Of(get(t, after)), localaffinity.Node{OS: "linux", Arch: "amd64"}) {
		t.Fatalf("with the webhook back, a new TaskRun is not pinned: %+v", get(t, after).Spec.PodTemplate)
	}
	servedLocally(t, after)
}

// A replica that does not lead has no config of its own (only the leader's watcher fills the
// store); its webhook answers from the config in the cluster, as `berth status` reads it.
func TestWebhookOfAReplicaThatDoesNotLeadReadsTheConfig(t *testing.T) {
	applyLocalConfig(t)
	cfg, err := webhook.InForce(hostconfig.NewStore(), c(), devstack.Namespace)(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if kind, ok := cfg.Strategy("linux/x86_64"); !ok || kind != "local" {
		t.Errorf("linux/x86_64 is %q (%v) in the config read from the cluster, want local", kind, ok)
	}
}

// warnedOn tells whether berth has recorded a Warning with reason on the TaskRun.
func warnedOn(tr *pipelinev1.TaskRun, reason string) (bool, error) {
	var events eventsv1.EventList
	if err := c().List(context.Background(), &events, client.InNamespace(tr.Namespace)); err != nil {
		return false, err
	}
	for _, e := range events.Items {
		if e.Regarding.Name == tr.Name && e.Regarding.UID == tr.UID && e.Type == corev1.EventTypeWarning && e.Reason == reason {
			return true, nil
		}
	}
	return false, nil
}
