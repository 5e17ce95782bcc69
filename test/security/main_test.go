// Package security_test attacks berth as a tenant would: a ServiceAccount that may read and
// write TaskRuns and Secrets in its own namespace and nothing else, acting through an
// impersonating client against a real apiserver, with berth's controller running under its
// shipped RBAC and real sshd hosts behind it. Each test asserts what a host owner would check
// afterwards: no file outside a build user's home changed, no admin key in any tenant secret,
// never more tasks on a host than its concurrency, every build user gone after its task.
package security_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/devstack"
	"github.com/berth-ci/berth/internal/testground/sshhosts"
	"github.com/berth-ci/berth/internal/testground/stacktest"
)

var stack *devstack.Stack

const (
	platform  = "linux/s390x"
	hostCount = 3
)

func TestMain(m *testing.M) {
	code := stacktest.MainWith(m, &stack, hostCount, controllerOptions(), auditKeys) // auditKeys: keyserver_flood_test.go
	os.RemoveAll(metricsTLS.certDir)
	os.Exit(code)
}

// controllerOptions are those of the package's in-process controller.
func controllerOptions() controller.Options {
	o := stacktest.Options()
	o.MirrorRevertInterval = 2 * time.Second
	o.MetricsAddress, o.MetricsSecure, o.MetricsCertDir = metricsServing() // metrics_test.go
	return o
}

// admin observes: the test's own eyes, never the attacker's hands.
func admin() client.Client { return stack.ControlPlane.Client }

// tenant is a namespace and the ServiceAccount that owns it.
type tenant struct {
	ns string
	c  client.Client
}

// newTenant makes a namespace whose ServiceAccount may do anything to TaskRuns and Secrets
// there, and nothing anywhere else.
func newTenant(t *testing.T, suffix string) *tenant {
	t.Helper()
	ctx := context.Background()
	ns := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	if len(ns) > 40 {
		ns = ns[:40]
	}
	ns = strings.Trim(ns+"-"+suffix, "-")
	if err := stack.ControlPlane.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"tekton.dev"}, Resources: []string{"taskruns"}, Verbs: all},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: all},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tenant", Namespace: ns}}},
	} {
		if err := admin().Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	user := "system:serviceaccount:" + ns + ":tenant"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	waitAllowed(t, ns, user, groups)
	cfg := rest.CopyConfig(stack.ControlPlane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: admin().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stacktest.FinishAllOnFailure(t, stack, ns) })
	return &tenant{ns: ns, c: c}
}

// waitAllowed waits until the apiserver's authorizer lets user create TaskRuns and Secrets in
// ns: it learns of a new Role and RoleBinding through its own informers, a moment after they
// are written, and a tenant acting at once was refused ("role tenant not found").
func waitAllowed(t *testing.T, ns, user string, groups []string) {
	t.Helper()
	allowed := func(ctx context.Context) (bool, error) {
		for _, r := range []authorizationv1.ResourceAttributes{
			{Namespace: ns, Verb: "create", Group: "tekton.dev", Resource: "taskruns"},
			{Namespace: ns, Verb: "create", Resource: "secrets"},
		} {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups, ResourceAttributes: &r}}
			if err := admin().Create(ctx, review); err != nil || !review.Status.Allowed {
				return false, err
			}
		}
		return true, nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true, allowed); err != nil {
		t.Fatalf("the tenant of %s was not allowed to create TaskRuns and Secrets within a minute: %v", ns, err)
	}
}

// taskRun is a TaskRun as buildah-remote makes them: PLATFORM and the secret volume.
func (tn *tenant) taskRun(name, platformParam string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tn.ns, Labels: map[string]string{}},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platformParam)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah",
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name}}}},
			},
		},
	}
}

func (tn *tenant) create(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	if err := tn.c.Create(context.Background(), tr); err != nil {
		t.Fatalf("the tenant creating %s: %v", tr.Name, err)
	}
	return tr
}

func get(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	return stacktest.Get(t, admin(), tr)
}

// relabel is the tenant editing its own TaskRun's labels.
func (tn *tenant) relabel(t *testing.T, tr *pipelinev1.TaskRun, edit func(map[string]string)) {
	t.Helper()
	now := get(t, tr)
	patch := client.MergeFrom(now.DeepCopy())
	if now.Labels == nil {
		now.Labels = map[string]string{}
	}
	edit(now.Labels)
	if err := tn.c.Patch(context.Background(), now, patch); err != nil {
		t.Fatalf("the tenant relabelling %s: %v", tr.Name, err)
	}
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.Eventually(t, what, cond)
}

func secretOf(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	return stacktest.SecretOf(t, admin(), tr)
}

func record(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Record(t, admin(), tr)
}

func phaseIs(t *testing.T, tr *pipelinev1.TaskRun, phase berthv1.Phase) *berthv1.Allocation {
	t.Helper()
	return stacktest.PhaseIs(t, admin(), tr, phase)
}

// waiting waits until the task waits for a slot (see stacktest.IsWaiting).
func waiting(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	stacktest.Waiting(t, admin(), tr)
}

// ready waits until the task has its build user (see stacktest.HandedOver).
func ready(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Ready(t, admin(), tr)
}

func finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil); err != nil {
		t.Fatal(err)
	}
}

func hostsByName() []*sshhosts.Host {
	hosts := append([]*sshhosts.Host{}, stack.Fleet.Hosts...)
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Name < hosts[j].Name })
	return hosts
}

func hostNamed(t *testing.T, name string) *sshhosts.Host {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		if h.Name == name {
			return h
		}
	}
	t.Fatalf("no host %s", name)
	return nil
}

// applyConfig puts a host config in force: every host serves platform with concurrency slots,
// plus extra keys.
func applyConfig(t *testing.T, concurrency int, extra map[string]string) {
	t.Helper()
	data := stack.StaticHostConfig(platform, concurrency)
	for k, v := range extra {
		data[k] = v
	}
	applyConfigData(t, data)
}

// applyConfigData puts exactly data in force as the host config (or has it judged and
// rejected, keeping the last good one).
func applyConfigData(t *testing.T, data map[string]string) {
	t.Helper()
	stacktest.ApplyConfig(t, stack, data, "ConfigApplied", "ConfigRejected")
}

// settled waits until berth owes nothing for the namespace: no finalizers or assigned hosts
// on its TaskRuns, no secrets of berth's but those of ended tasks, no records and no internal TaskRuns for it.
func settled(t *testing.T, ns string) {
	t.Helper()
	eventually(t, "everything of "+ns+" is cleaned up", func() (bool, error) {
		ctx := context.Background()
		var trs pipelinev1.TaskRunList
		if err := admin().List(ctx, &trs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, tr := range trs.Items {
			if host := tr.Labels[contract.AssignedHostLabel]; len(tr.Finalizers) > 0 || host != "" && host != contract.Localhost {
				return false, fmt.Errorf("%s still has finalizers %v / host %q", tr.Name, tr.Finalizers, host)
			}
		}
		if live, err := stacktest.SecretsOfLiveTasks(ctx, admin(), ns); err != nil || len(live) > 0 {
			return false, fmt.Errorf("secrets of tasks still running: %v (%v)", live, err)
		}
		var records berthv1.AllocationList
		if err := admin().List(ctx, &records, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, rec := range records.Items {
			if rec.Spec.TaskRun.Namespace == ns {
				return false, fmt.Errorf("record of %s left: phase %s, debts %+v, message %q", rec.Spec.TaskRun.Key(), rec.Status.Phase, rec.Status.Debts, rec.Status.Message)
			}
		}
		var internal pipelinev1.TaskRunList
		if err := admin().List(ctx, &internal, client.InNamespace(devstack.Namespace),
			client.MatchingLabels{contract.UserTaskNamespaceLabel: ns}); err != nil {
			return false, err
		}
		if len(internal.Items) > 0 {
			return false, fmt.Errorf("%d internal TaskRuns left, e.g. %s", len(internal.Items), internal.Items[0].Name)
		}
		return true, nil
	})
}

// handedOver tells whether the record's task has its build user (see stacktest.HandedOver).
func handedOver(t *testing.T, rec *berthv1.Allocation) bool {
	t.Helper()
	ok, err := stacktest.HandedOver(context.Background(), admin(), rec)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}
