package rbac_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/rbac"
)

const (
	// namespace stands in for berth-system.
	namespace = "rbac-check"
	// userNamespace stands in for a namespace where users run their TaskRuns.
	userNamespace = "rbac-user"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunTests(m, &cp))
}

var (
	applyOnce sync.Once
	applyErr  error
)

// applied applies the RBAC once for the package. It applies twice, so that the update path
// (objects already there) runs too.
func applied(t *testing.T) {
	t.Helper()
	applyOnce.Do(func() {
		ctx := context.Background()
		if applyErr = rbac.Apply(ctx, cp.Client, namespace); applyErr != nil {
			return
		}
		if applyErr = rbac.Apply(ctx, cp.Client, namespace); applyErr != nil {
			return
		}
		applyErr = cp.EnsureNamespace(ctx, userNamespace)
	})
	if applyErr != nil {
		t.Fatal(applyErr)
	}
}

// clientAs is a client acting as a ServiceAccount in namespace.
func clientAs(t *testing.T, serviceAccount string) client.Client {
	t.Helper()
	c, err := client.New(cp.ConfigFor(namespace, serviceAccount), client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// allowed fails the test unless do succeeds. The API server's RBAC authorizer learns of new
// bindings through a watch, so a Forbidden right after Apply is retried for a while.
func allowed(t *testing.T, what string, do func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := do()
		if err == nil {
			return
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Errorf("%s: want allowed, got %v", what, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// denied fails the test unless do is refused as Forbidden. Call it after an allowed check for
// the same ServiceAccount, so the denial is RBAC's answer and not bindings still on their way.
func denied(t *testing.T, what string, do func() error) {
	t.Helper()
	if err := do(); !apierrors.IsForbidden(err) {
		t.Errorf("%s: want Forbidden, got %v", what, err)
	}
}

func secret(ns, name string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: map[string]string{"k": "v"}}
}

func configMap(ns, name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// event is an events.k8s.io Event about tr, as berth records them.
func event(tr *pipelinev1.TaskRun, name string) *eventsv1.Event {
	return &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: tr.Namespace, Name: name},
		EventTime:           metav1.NewMicroTime(time.Now()),
		ReportingController: "berth.dev/rbac-test",
		ReportingInstance:   "rbac-test",
		Action:              "Check",
		Reason:              "Checking",
		Type:                corev1.EventTypeNormal,
		Regarding:           corev1.ObjectReference{APIVersion: "tekton.dev/v1", Kind: "TaskRun", Namespace: tr.Namespace, Name: tr.Name},
	}
}

// userTaskRun creates, as admin, a TaskRun in the user namespace.
func userTaskRun(t *testing.T, name string) *pipelinev1.TaskRun {
	t.Helper()
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: userNamespace, Name: name},
		Spec: pipelinev1.TaskRunSpec{
			TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "build", Image: "busybox", Script: "true"}}},
		},
	}
	if err := cp.Client.Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestControllerHasExactlyItsPermissions(t *testing.T) {
	applied(t)
	ctx := context.Background()
	c := clientAs(t, "berth-controller")
	tr := userTaskRun(t, "controller-check")

	allowed(t, "list TaskRuns in all namespaces", func() error { return c.List(ctx, &pipelinev1.TaskRunList{}) })
	allowed(t, "create a Secret in a user namespace", func() error { return c.Create(ctx, secret(userNamespace, "controller-check")) })
	allowed(t, "list ConfigMaps in its namespace", func() error {
		return c.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(namespace))
	})
	allowed(t, "create a Lease in its namespace", func() error {
		return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "controller-check"}})
	})
	allowed(t, "record an events.k8s.io Event on a user TaskRun", func() error {
		return c.Create(ctx, event(tr, "controller-check"))
	})

	allowed(t, "create an Allocation in its namespace", func() error {
		return c.Create(ctx, &berthv1.Allocation{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "controller-check"},
			Spec: berthv1.AllocationSpec{TaskRun: berthv1.TaskRunRef{Namespace: userNamespace, Name: "x", UID: "u"}, Platform: "linux/arm64", Strategy: "static", Queued: metav1.Now()}})
	})
	allowed(t, "write a BuildHost's status, apart from its spec, in its namespace", func() error {
		bh := &berthv1.BuildHost{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "controller-check"}, Spec: berthv1.BuildHostSpec{HostName: "controller-check"}}
		if err := c.Create(ctx, bh); err != nil {
			return err
		}
		bh.Status.Platform = "linux/arm64"
		return c.Status().Update(ctx, bh)
	})
	denied(t, "create an Allocation in a user namespace", func() error {
		return c.Create(ctx, &berthv1.Allocation{ObjectMeta: metav1.ObjectMeta{Namespace: userNamespace, Name: "controller-check"},
			Spec: berthv1.AllocationSpec{TaskRun: berthv1.TaskRunRef{Namespace: userNamespace, Name: "x", UID: "u"}, Platform: "linux/arm64", Strategy: "static", Queued: metav1.Now()}})
	})
	denied(t, "update a user TaskRun whole", func() error {
		var live pipelinev1.TaskRun
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(tr), &live); err != nil {
			return err
		}
		return c.Update(ctx, &live)
	})
	denied(t, "create a TaskRun in a user namespace", func() error {
		return c.Create(ctx, &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: userNamespace, Name: "controller-made"},
			Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "s", Image: "busybox", Script: "true"}}}}})
	})
	denied(t, "update a Secret in a user namespace", func() error {
		s := secret(userNamespace, "controller-update-check")
		if err := cp.Client.Create(ctx, s); err != nil {
			return err
		}
		return c.Update(ctx, s)
	})
	allowed(t, "update a Secret in its namespace (a one-time key kept for a retried task's next attempt)", func() error {
		s := secret(namespace, "controller-update-check")
		if err := cp.Client.Create(ctx, s); client.IgnoreAlreadyExists(err) != nil {
			return err
		}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return err
		}
		return c.Update(ctx, s)
	})
	denied(t, "list ConfigMaps in a user namespace", func() error {
		return c.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(userNamespace))
	})
	allowed(t, "create a ConfigMap in its namespace (known hosts, switch-over marker)", func() error {
		return c.Create(ctx, configMap(namespace, "controller-check"))
	})
	allowed(t, "create a TokenReview (who scrapes its metrics)", func() error {
		return c.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "controller-check"}})
	})
	allowed(t, "create a SubjectAccessReview (may they get /metrics)", func() error {
		return c.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "controller-check",
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}})
	})
	denied(t, "list Pods in its namespace", func() error { return c.List(ctx, &corev1.PodList{}, client.InNamespace(namespace)) })
	denied(t, "list Pods in all namespaces", func() error { return c.List(ctx, &corev1.PodList{}) })
	denied(t, "create a Lease in a user namespace", func() error {
		return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: userNamespace, Name: "controller-check"}})
	})
	denied(t, "delete a Namespace", func() error {
		return c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: userNamespace}})
	})
}

func TestHostTasksHaveExactlyTheirPermissions(t *testing.T) {
	applied(t)
	ctx := context.Background()
	c := clientAs(t, "berth-host-tasks")
	tr := userTaskRun(t, "host-tasks-check")

	allowed(t, "create a ConfigMap in berth's namespace", func() error { return c.Create(ctx, configMap(namespace, "host-tasks-check")) })

	s := secret(userNamespace, "host-tasks-check")
	denied(t, "get a user TaskRun", func() error { return c.Get(ctx, client.ObjectKeyFromObject(tr), &pipelinev1.TaskRun{}) })
	denied(t, "create a Secret in a user namespace", func() error { return c.Create(ctx, s) })
	denied(t, "get a Secret in berth's namespace", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "any-admin-key"}, &corev1.Secret{})
	})
	denied(t, "record an events.k8s.io Event on a user TaskRun", func() error {
		return c.Create(ctx, event(tr, "host-tasks-check"))
	})
	denied(t, "list Secrets in a user namespace", func() error {
		return c.List(ctx, &corev1.SecretList{}, client.InNamespace(userNamespace))
	})
	denied(t, "list Secrets in all namespaces", func() error { return c.List(ctx, &corev1.SecretList{}) })
	denied(t, "delete a Secret", func() error { return c.Delete(ctx, secret(userNamespace, "any")) })
	denied(t, "list TaskRuns", func() error { return c.List(ctx, &pipelinev1.TaskRunList{}, client.InNamespace(userNamespace)) })
	denied(t, "create a TokenReview", func() error {
		return c.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "host-tasks-check"}})
	})
	denied(t, "create a ConfigMap in a user namespace", func() error {
		return c.Create(ctx, configMap(userNamespace, "host-tasks-check"))
	})
}

// TestManifestsAreAllFoundAndLabelled guards Load itself: a file it skipped would leave a
// permission out of every test that relies on Apply.
func TestManifestsAreAllFoundAndLabelled(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	manifests, err := rbac.Load(filepath.Join(root, rbac.Dir))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range manifests {
		got = append(got, m.Object.GetKind()+"/"+m.Object.GetName())
		if m.Object.GetLabels()["app.kubernetes.io/part-of"] != "berth" {
			t.Errorf("%s: no label app.kubernetes.io/part-of=berth", m)
		}
	}
	sort.Strings(got)
	want := []string{
		"ClusterRole/berth-controller", "ClusterRole/berth-metrics-auth", "ClusterRole/berth-metrics-reader",
		"ClusterRoleBinding/berth-controller", "ClusterRoleBinding/berth-metrics-auth",
		"Role/berth-controller", "Role/berth-host-tasks",
		"RoleBinding/berth-controller", "RoleBinding/berth-host-tasks",
		"ServiceAccount/berth-controller", "ServiceAccount/berth-host-tasks",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("config/rbac holds\n  %s\nwant\n  %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}
