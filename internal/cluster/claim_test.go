package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// realClaim is the claim Konflux's eaas-provision-space (../shared/real/tasks) creates when it
// runs with the given TaskRun context and params: its heredoc, with Tekton's variables and then
// the shell's filled in.
func realClaim(t *testing.T, tekton map[string]string) map[string]any {
	t.Helper()
	obj, err := realdata.Task("eaas-provision-space.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var task struct {
		Spec struct {
			Steps []struct {
				Script string `json:"script"`
				Env    []struct {
					Name  string `json:"name"`
					Value string `json:"value"`
				} `json:"env"`
			} `json:"steps"`
		} `json:"spec"`
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &task); err != nil {
		t.Fatal(err)
	}
	variable := regexp.MustCompile(`\$\(([^)]+)\)`)
	for _, step := range task.Spec.Steps {
		_, rest, found := strings.Cut(step.Script, "<<EOF > namespace_claim.yaml\n")
		heredoc, _, closed := strings.Cut(rest, "\nEOF\n")
		if !found || !closed {
			continue
		}
		env := map[string]string{}
		for _, e := range step.Env {
			env[e.Name] = variable.ReplaceAllStringFunc(e.Value, func(v string) string { return tekton[v[2:len(v)-1]] })
		}
		var claim map[string]any
		if err := yaml.Unmarshal([]byte(os.Expand(heredoc, func(k string) string { return env[k] })), &claim); err != nil {
			t.Fatalf("the real Task's claim does not parse: %v", err)
		}
		return claim
	}
	t.Fatal("the real eaas-provision-space writes no namespace_claim.yaml any more")
	return nil
}

// berth makes the very claim Konflux's own Task makes: same name, owner reference and
// connection Secret.
func TestNewClaimIsWhatKonfluxsTaskCreates(t *testing.T) {
	for _, kind := range []string{"PipelineRun", "TaskRun"} {
		req := SpaceRequest{Namespace: "team-tenant", Name: "it-run-x7k2p", Owner: Owner{Kind: kind, Name: "it-pipeline-4kq9z", UID: "6a1f3c2e-8b4d-4e5f-9a7c-1d2e3f4a5b6c"}}
		want := realClaim(t, map[string]string{
			"context.taskRun.namespace": req.Namespace, "context.taskRun.name": req.Name,
			"params.ownerKind": kind, "params.ownerName": req.Owner.Name, "params.ownerUid": string(req.Owner.UID),
		})
		// Compared as JSON sees them, as the apiserver would receive them.
		var got map[string]any
		raw, err := json.Marshal(newClaim(req).Object)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("owner %s: berth's claim\n%v\nKonflux's Task's claim\n%v", kind, got, want)
		}
	}
}

func TestSpaceTargetReadsTheSecretThenItsKubeconfig(t *testing.T) {
	kubeconfig := []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example:6443"}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: from-kubeconfig}}]
current-context: x
`)
	for _, tc := range []struct {
		name                  string
		data                  map[string][]byte
		namespace, server, is string
	}{
		{"the composition's keys", map[string][]byte{kubeconfigKey: []byte("{"), namespaceKey: []byte("ns"), apiServerKey: []byte("https://api")}, "ns", "https://api", ""},
		{"the kubeconfig's context", map[string][]byte{kubeconfigKey: kubeconfig}, "from-kubeconfig", "https://api.example:6443", ""},
		{"a kubeconfig that does not parse", map[string][]byte{kubeconfigKey: []byte("{")}, "", "", "does not parse"},
	} {
		ns, server, err := spaceTarget(tc.data)
		if tc.is != "" {
			mustContain(t, tc.name, errText(err), tc.is)
			continue
		}
		if err != nil || ns != tc.namespace || server != tc.server {
			t.Errorf("%s: %q, %q, %v", tc.name, ns, server, err)
		}
	}
}

// serveClaim plays Crossplane and the eaas composition for a claim: Waiting, then Ready with
// a Secret whose kubeconfig acts in a new namespace (and names it only in its context). The
// claim stays Waiting until the progress shows it, as a real composition takes minutes: the
// waiter polls, and a state shorter than its interval is one it may never see.
func serveClaim(namespace, name string, progress *log) <-chan served {
	out := make(chan served, 1)
	go func() {
		claim, err := awaitObject(newObject(claimGVK, namespace, name))
		if err == nil {
			err = setStatus(claim, map[string]any{"conditions": []any{
				condition("Synced", "True", "ReconcileSuccess", ""),
				condition("Ready", "False", "Waiting", "Composite resource claim is waiting for composite resource to become Ready"),
			}})
		}
		for deadline := time.Now().Add(fast.Timeout); err == nil && !strings.Contains(progress.String(), "Ready=False (Waiting)"); {
			if time.Now().After(deadline) {
				err = errors.New("the waiter never reported the claim Waiting")
			}
			time.Sleep(fast.Interval)
		}
		access := SpaceAccess{Namespace: namespace + "-claimed", TenantNamespace: namespace, SecretName: name + "-secret", ClusterURL: cp.Config.Host}
		if err == nil {
			err = grantSpace(namespace, access.Namespace, access.SecretName)
		}
		if err == nil {
			err = setStatus(claim, map[string]any{"conditions": []any{
				condition("Synced", "True", "ReconcileSuccess", ""), condition("Ready", "True", "Available", ""),
			}})
		}
		out <- served{access: access, err: err}
	}()
	return out
}

// A claim is chosen where the cluster serves it, made as Konflux's Task makes it, waited for
// until Ready, and its Secret's kubeconfig acts in the space; a re-run reuses it.
func TestProvisionSpaceThroughAClaim(t *testing.T) {
	ctx := context.Background()
	tenant := newNamespace(t, "tenant")
	req := SpaceRequest{Namespace: tenant, Name: "integration-run", Owner: newRun(t, tenant)}
	var progress log
	service := serveClaim(tenant, req.Name, &progress)
	access, err := ProvisionSpace(ctx, kube, req, fast, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	s := <-service
	if s.err != nil {
		t.Fatal(s.err)
	}
	if access.Namespace != s.access.Namespace || access.SecretName != req.Name+"-secret" || access.TenantNamespace != tenant || access.ClusterURL == "" {
		t.Fatalf("got access %+v, the service granted %+v", access, s.access)
	}
	mustContain(t, "the progress", progress.String(), "asking with Namespace claims", "prefers the claim",
		"created Namespace claim "+tenant+"/integration-run", "Ready=False (Waiting)", "Ready=True (Available); Synced=True (ReconcileSuccess)")
	actsAndIsReused(t, req, access, "reusing Namespace claim")

	if err := ReleaseClaim(ctx, kube, tenant, req.Name, fast, &log{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: tenant, Name: req.Name}, newObject(claimGVK, tenant, req.Name)); !apierrors.IsNotFound(err) {
		t.Fatalf("the claim is still there: %v", err)
	}
}

func TestProvisionSpaceRefusesAClaimOfAnotherSecret(t *testing.T) {
	tenant := newNamespace(t, "tenant")
	other := newObject(claimGVK, tenant, "run")
	other.Object["spec"] = map[string]any{"writeConnectionSecretToRef": map[string]any{"name": "someone-elses"}}
	if err := kube.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	req := SpaceRequest{Namespace: tenant, Name: "run", API: SpaceAPIClaim, Owner: newRun(t, tenant)}
	_, err := ProvisionSpace(context.Background(), kube, req, fast, &log{})
	mustContain(t, "the error", errText(err), "Namespace claim "+tenant+"/run exists with connection Secret \"someone-elses\", not \"run-secret\"")
}

// A claim that never gets ready ends the wait at its timeout, naming both of Crossplane's
// conditions: what the composition said is the cause a person needs.
func TestProvisionSpaceThroughAClaimTimesOutSayingWhy(t *testing.T) {
	tenant := newNamespace(t, "tenant")
	req := SpaceRequest{Namespace: tenant, Name: "run", API: SpaceAPIClaim, Owner: newRun(t, tenant)}
	failing := make(chan error, 1)
	go func() {
		claim, err := awaitObject(newObject(claimGVK, tenant, req.Name))
		if err == nil {
			err = setStatus(claim, map[string]any{"conditions": []any{
				condition("Synced", "False", "ReconcileError", "cannot compose resources: function-go-templating failed"),
				condition("Ready", "False", "Waiting", "Composite resource claim is waiting for composite resource to become Ready"),
			}})
		}
		failing <- err
	}()
	var progress log
	_, err := ProvisionSpace(context.Background(), kube, req, Polling{Timeout: 2 * time.Second, Interval: fast.Interval}, &progress)
	if err := <-failing; err != nil {
		t.Fatal(err)
	}
	mustContain(t, "the error", errText(err), "Namespace claim "+tenant+"/run is not ready after 2s",
		"Ready=False (Waiting)", "Synced=False (ReconcileError): cannot compose resources: function-go-templating failed")
	mustContain(t, "the progress", progress.String(), "waiting for Namespace claim "+tenant+"/run to be Ready", "Secret run-secret")
}

// awaitObject polls until an object exists.
func awaitObject(u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		err := kube.Get(context.Background(), client.ObjectKeyFromObject(u), u)
		if err == nil || !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return u, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
