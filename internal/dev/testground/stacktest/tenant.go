package stacktest

import (
	"context"
	"fmt"
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
	"github.com/berth-ci/berth/internal/dev/devstack"
)

// Tenant is a namespace and the ServiceAccount that owns it, as the attacks of the security
// tests act: through Client, impersonating that ServiceAccount.
type Tenant struct {
	Namespace string
	Client    client.Client
}

// NewTenant makes a namespace, named after the test and suffix, whose ServiceAccount may do
// anything to TaskRuns and Secrets there, and nothing anywhere else.
func NewTenant(t *testing.T, s *devstack.Stack, suffix string) *Tenant {
	t.Helper()
	ctx := context.Background()
	admin := s.ControlPlane.Client
	ns := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	if len(ns) > 40 {
		ns = ns[:40]
	}
	ns = strings.Trim(ns+"-"+suffix, "-")
	if err := s.ControlPlane.EnsureNamespace(ctx, ns); err != nil {
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
		if err := admin.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	user := "system:serviceaccount:" + ns + ":tenant"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	waitAllowed(t, admin, ns, user, groups)
	cfg := rest.CopyConfig(s.ControlPlane.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { FinishAllOnFailure(t, s, ns) })
	return &Tenant{Namespace: ns, Client: c}
}

// waitAllowed waits until the apiserver's authorizer lets user create TaskRuns and Secrets in
// ns: it learns of a new Role and RoleBinding through its own informers, a moment after they
// are written, and a tenant acting at once was refused ("role tenant not found").
func waitAllowed(t *testing.T, admin client.Client, ns, user string, groups []string) {
	t.Helper()
	allowed := func(ctx context.Context) (bool, error) {
		for _, r := range []authorizationv1.ResourceAttributes{
			{Namespace: ns, Verb: "create", Group: "tekton.dev", Resource: "taskruns"},
			{Namespace: ns, Verb: "create", Resource: "secrets"},
		} {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: groups, ResourceAttributes: &r}}
			if err := admin.Create(ctx, review); err != nil || !review.Status.Allowed {
				return false, err
			}
		}
		return true, nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true, allowed); err != nil {
		t.Fatalf("the tenant of %s was not allowed to create TaskRuns and Secrets within a minute: %v", ns, err)
	}
}

// TaskRun is a TaskRun of the tenant's as buildah-remote makes them: PLATFORM and the secret
// volume.
func (tn *Tenant) TaskRun(name, platformParam string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tn.Namespace, Labels: map[string]string{}},
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

// Create is the tenant creating tr.
func (tn *Tenant) Create(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	if err := tn.Client.Create(context.Background(), tr); err != nil {
		t.Fatalf("the tenant creating %s: %v", tr.Name, err)
	}
	return tr
}

// Settled waits until berth owes nothing for the namespace: no finalizers or assigned hosts
// on its TaskRuns, no secrets of berth's but those of ended tasks, no records and no internal
// TaskRuns for it.
func Settled(t *testing.T, c client.Reader, ns string) {
	t.Helper()
	Eventually(t, "everything of "+ns+" is cleaned up", func() (bool, error) {
		ctx := context.Background()
		var trs pipelinev1.TaskRunList
		if err := c.List(ctx, &trs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, tr := range trs.Items {
			if host := tr.Labels[contract.AssignedHostLabel]; len(tr.Finalizers) > 0 || host != "" && host != contract.Localhost {
				return false, fmt.Errorf("%s still has finalizers %v / host %q", tr.Name, tr.Finalizers, host)
			}
		}
		if live, err := SecretsOfLiveTasks(ctx, c, ns); err != nil || len(live) > 0 {
			return false, fmt.Errorf("secrets of tasks still running: %v (%v)", live, err)
		}
		var records berthv1.AllocationList
		if err := c.List(ctx, &records, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, rec := range records.Items {
			if rec.Spec.TaskRun.Namespace == ns {
				return false, fmt.Errorf("record of %s left: phase %s, debts %+v, message %q", rec.Spec.TaskRun.Key(), rec.Status.Phase, rec.Status.Debts, rec.Status.Message)
			}
		}
		var internal pipelinev1.TaskRunList
		if err := c.List(ctx, &internal, client.InNamespace(devstack.Namespace),
			client.MatchingLabels{contract.UserTaskNamespaceLabel: ns}); err != nil {
			return false, err
		}
		if len(internal.Items) > 0 {
			return false, fmt.Errorf("%d internal TaskRuns left, e.g. %s", len(internal.Items), internal.Items[0].Name)
		}
		return true, nil
	})
}
