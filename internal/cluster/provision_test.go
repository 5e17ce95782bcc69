package cluster

import (
	"context"
	"reflect"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func instanceNames(t *testing.T, space *Space) []string {
	t.Helper()
	list := newList(instanceGVK)
	if err := kube.List(context.Background(), list, client.InNamespace(space.Namespace)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range list.Items {
		names = append(names, u.GetName())
	}
	return names
}

func TestProvisionCreatesTheInstanceWithItsParametersAndCredentialsOnce(t *testing.T) {
	ctx := context.Background()
	space, access := newSpace(t)
	makeTemplate(t, "hypershift-aws-byoc", 1)
	makeQuota(t, space.Namespace, 0, map[string]int64{"hypershift-aws-byoc": 1})
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: access.TenantNamespace, Name: "my-aws"},
		Data: map[string][]byte{"aws_access_key_id": []byte("AKIA-test"), "aws_secret_access_key": []byte("not-a-real-secret")}}
	if err := kube.Create(ctx, creds); err != nil {
		t.Fatal(err)
	}
	byoc, err := ReadCredentials(ctx, kube, access.TenantNamespace, "my-aws")
	if err != nil {
		t.Fatal(err)
	}
	req := ClusterRequest{Name: "integration-run", Template: "hypershift-aws-byoc", Version: "4.17.3", InstanceType: "m6g.large",
		Timeout: "30m", Parameters: []Parameter{{"fips", "true"}}, Credentials: byoc}
	var progress log
	inst, err := Provision(ctx, space, req, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	want := []Parameter{{"version", "4.17.3"}, {"instanceType", "m6g.large"}, {"timeout", "30m"}, {"fips", "true"}, {"credentialsSecret", "my-aws"}}
	if !reflect.DeepEqual(inst.Parameters, want) || inst.Template != req.Template {
		t.Fatalf("created %s with %+v, want %+v", inst.Template, inst.Parameters, want)
	}
	var copied corev1.Secret
	if err := kube.Get(ctx, client.ObjectKey{Namespace: space.Namespace, Name: "my-aws"}, &copied); err != nil {
		t.Fatalf("the credentials were not copied into the space: %v", err)
	}
	if !reflect.DeepEqual(copied.Data, creds.Data) {
		t.Fatalf("the space's copy of the credentials differs from the tenant's")
	}
	if strings.Contains(progress.String(), "not-a-real-secret") {
		t.Fatalf("the progress shows the credentials:\n%s", progress.String())
	}

	// A re-run (a retried TaskRun) finds the instance even though the quota is full now.
	progress = log{}
	again, err := Provision(ctx, space, req, &progress)
	if err != nil || again.Name != inst.Name {
		t.Fatalf("a re-run got %+v, %v\n%s", again, err, progress.String())
	}
	mustContain(t, "the re-run's progress", progress.String(), "reusing ClusterTemplateInstance "+space.Namespace+"/integration-run")
	if names := instanceNames(t, space); len(names) != 1 {
		t.Fatalf("two runs left instances %v, want one", names)
	}

	// The same name for another template is someone else's cluster.
	req.Template = "other"
	_, err = Provision(ctx, space, req, &log{})
	mustContain(t, "the error", errText(err), "exists already with template hypershift-aws-byoc, not other")
}

// Before it creates anything, provision refuses what the space's quota does not allow, and
// says which quota and what is in use.
func TestProvisionRefusesWhatTheQuotaDoesNotAllowBeforeCreating(t *testing.T) {
	makeTemplate(t, "small", 1)
	makeTemplate(t, "large", 3)
	for name, tc := range map[string]struct {
		budget   int64
		allowed  map[string]int64
		existing map[string]string // instance → template
		template string
		want     []string
	}{
		"not allowed": {allowed: map[string]int64{"small": 0}, template: "large",
			want: []string{"template large is not allowed in space", "ClusterTemplateQuota", "/quota allows only small"}},
		"count used up": {allowed: map[string]int64{"small": 2}, existing: map[string]string{"a": "small", "b": "small"}, template: "small",
			want: []string{"allows 2 cluster(s) of template small and 2 exist (a, b)"}},
		"budget spent": {budget: 4, allowed: map[string]int64{"small": 0, "large": 0}, existing: map[string]string{"a": "small", "b": "small"}, template: "large",
			want: []string{"has a budget of 4 and 2 is spent; template large costs 3 more"}},
		"no such template": {allowed: map[string]int64{"small": 0}, template: "medium",
			want: []string{"there is no ClusterTemplate medium"}},
	} {
		t.Run(name, func(t *testing.T) {
			space, _ := newSpace(t)
			makeQuota(t, space.Namespace, tc.budget, tc.allowed)
			for inst, template := range tc.existing {
				makeInstance(t, space.Namespace, inst, template)
			}
			before := instanceNames(t, space)
			_, err := Provision(context.Background(), space, ClusterRequest{Name: "new", Template: tc.template}, &log{})
			mustContain(t, "the error", errText(err), tc.want...)
			if after := instanceNames(t, space); len(after) != len(before) {
				t.Fatalf("instances %v after a refusal, %v before", after, before)
			}
		})
	}
}

// What the quota allows, provision creates, counting only the instances that exist.
func TestProvisionCreatesWithinTheQuota(t *testing.T) {
	space, _ := newSpace(t)
	makeTemplate(t, "small", 1)
	makeQuota(t, space.Namespace, 3, map[string]int64{"small": 3})
	makeInstance(t, space.Namespace, "a", "small")
	if _, err := Provision(context.Background(), space, ClusterRequest{Name: "b", Template: "small"}, &log{}); err != nil {
		t.Fatal(err)
	}
}

// The cluster service checks the quota again at admission (a validating webhook); its refusal
// is reported as one. A ValidatingAdmissionPolicy stands in for the webhook here.
func TestProvisionReportsTheServicesAdmissionRefusal(t *testing.T) {
	ctx := context.Background()
	space, _ := newSpace(t)
	makeTemplate(t, "small", 1)
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "quota-" + space.Namespace},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"clustertemplate.openshift.io"}, APIVersions: []string{"v1alpha1"},
						Resources: []string{"clustertemplateinstances"}},
				}}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "false",
				Message: "ClusterTemplateQuota quota: template small is over its count"}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": space.Namespace}}}},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The policy takes effect a moment after it is made; a dry run shows when.
	eventually(t, "the admission policy to take effect", func() bool {
		probe := newObject(instanceGVK, space.Namespace, "probe")
		probe.Object["spec"] = map[string]any{"clusterTemplateRef": "small"}
		return refused(kube.Create(ctx, probe, client.DryRunAll))
	})
	_, err := Provision(ctx, space, ClusterRequest{Name: "run", Template: "small"}, &log{})
	mustContain(t, "the error", errText(err), "the cluster service refused ClusterTemplateInstance "+space.Namespace+"/run of template small at admission",
		"template small is over its count")
}

func TestProvisionRejectsAParameterGivenTwice(t *testing.T) {
	space, _ := newSpace(t)
	_, err := Provision(context.Background(), space, ClusterRequest{Name: "run", Template: "small", Version: "4.17",
		Parameters: []Parameter{{"version", "4.18"}}}, &log{})
	mustContain(t, "the error", errText(err), "template parameter version is given twice")
}
