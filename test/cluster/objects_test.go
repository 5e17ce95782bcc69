package cluster

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/caasstandin"
)

// The cluster-templates service's kinds, as the tests read and make them.
var (
	instanceGVK = schema.GroupVersionKind{Group: "clustertemplate.openshift.io", Version: "v1alpha1", Kind: "ClusterTemplateInstance"}
	quotaGVK    = schema.GroupVersionKind{Group: "clustertemplate.openshift.io", Version: "v1alpha1", Kind: "ClusterTemplateQuota"}
)

// The space service's request and claim, in the tenant's namespace.
var (
	spaceRequestGVK = schema.GroupVersionKind{Group: "toolchain.dev.openshift.com", Version: "v1alpha1", Kind: "SpaceRequest"}
	claimGVK        = schema.GroupVersionKind{Group: "eaas.konflux-ci.dev", Version: "v1alpha1", Kind: "Namespace"}
)

// admin is the test's own eyes: the control plane's administrator, never a Task's hands.
func admin() client.Client { return stack.ControlPlane.Client }

func object(gvk schema.GroupVersionKind, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// instance reads a ClusterTemplateInstance; nil if there is none.
func instance(t *testing.T, namespace, name string) *unstructured.Unstructured {
	t.Helper()
	u := object(instanceGVK, namespace, name)
	err := admin().Get(context.Background(), client.ObjectKeyFromObject(u), u)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// instanceNames lists the ClusterTemplateInstances of a namespace.
func instanceNames(t *testing.T, namespace string) []string {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(instanceGVK.GroupVersion().WithKind(instanceGVK.Kind + "List"))
	if err := admin().List(context.Background(), list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range list.Items {
		names = append(names, i.GetName())
	}
	return names
}

// field is a string field of an object, "" where it is not set.
func field(u *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, path...)
	return s
}

// parameter is the value of a template parameter of an instance, and whether it is given.
func parameter(t *testing.T, inst *unstructured.Unstructured, name string) (string, bool) {
	t.Helper()
	params, _, err := unstructured.NestedSlice(inst.Object, "spec", "parameters")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range params {
		if m, ok := p.(map[string]any); ok && m["name"] == name {
			v, _ := m["value"].(string)
			return v, true
		}
	}
	return "", false
}

// makeQuota gives a space a ClusterTemplateQuota allowing templates (name → count, 0 for no
// count limit) within budget (0 for none).
func makeQuota(t *testing.T, namespace, name string, budget int64, allowed map[string]int64) {
	t.Helper()
	var templates []any
	for template, count := range allowed {
		a := map[string]any{"name": template}
		if count > 0 {
			a["count"] = count
		}
		templates = append(templates, a)
	}
	q := object(quotaGVK, namespace, name)
	spec := map[string]any{"allowedTemplates": templates}
	if budget > 0 {
		spec["budget"] = budget
	}
	q.Object["spec"] = spec
	if err := admin().Create(context.Background(), q); err != nil {
		t.Fatal(err)
	}
}

// clustersIn lists the control planes the CaaS stand-in runs for instances of a namespace.
func clustersIn(namespace string) []caasstandin.Cluster {
	var out []caasstandin.Cluster
	for _, c := range stack.CaaS.Clusters() {
		if c.Namespace == namespace {
			out = append(out, c)
		}
	}
	return out
}

// clusterConfig is how to reach a ready cluster as its admin: the kubeconfig its instance's
// status names.
func clusterConfig(t *testing.T, namespace, name string) *rest.Config {
	t.Helper()
	inst := instance(t, namespace, name)
	if inst == nil {
		t.Fatalf("no ClusterTemplateInstance %s/%s", namespace, name)
	}
	var secret corev1.Secret
	key := client.ObjectKey{Namespace: namespace, Name: field(inst, "status", "kubeconfig", "name")}
	if err := admin().Get(context.Background(), key, &secret); err != nil {
		t.Fatalf("reading the kubeconfig Secret of %s/%s: %v", namespace, name, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["kubeconfig"])
	if err != nil {
		t.Fatalf("the kubeconfig of %s/%s: %v", namespace, name, err)
	}
	cfg.Timeout = 5 * time.Second
	return cfg
}

// answers is nil if the cluster's apiserver answers, else why not.
func answers(cfg *rest.Config) error {
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	resp, err := c.Get(cfg.Host + "/livez")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /livez: %s", resp.Status)
	}
	return nil
}

// gone waits until an object no longer exists.
func gone(t *testing.T, what string, obj client.Object) {
	t.Helper()
	eventually(t, what+" is gone", func() (bool, error) {
		err := admin().Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

func resultOf(tr *pipelinev1.TaskRun, name string) string {
	for _, r := range tr.Status.Results {
		if r.Name == name {
			return r.Value.StringVal
		}
	}
	return ""
}

// runTask creates a TaskRun and returns it once it has ended.
func runTask(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	ctx := context.Background()
	if err := admin().Create(ctx, tr); err != nil {
		t.Fatalf("creating TaskRun %s: %v", tr.Name, err)
	}
	var got pipelinev1.TaskRun
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, pipelineLimit, true, func(ctx context.Context) (bool, error) {
		if err := admin().Get(ctx, client.ObjectKeyFromObject(tr), &got); err != nil {
			return false, err
		}
		return got.IsDone(), nil
	})
	if err != nil {
		t.Fatalf("TaskRun %s did not end within %s: %v", tr.Name, pipelineLimit, err)
	}
	return &got
}

// secrets are what must never appear in a log: each a value to look for, by a description that
// names where it is kept and never quotes it.
type secrets map[string]string

// add reads Secrets and keeps their values: each value whole (but those of notSecret) and, for
// a kubeconfig, each credential in it on its own, and the base64 of each.
func (s secrets) add(t *testing.T, namespace string, names ...string) {
	t.Helper()
	for _, name := range names {
		var secret corev1.Secret
		if err := admin().Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, &secret); err != nil {
			t.Fatalf("reading Secret %s/%s: %v", namespace, name, err)
		}
		for key, value := range secret.Data {
			if notSecret[key] {
				continue
			}
			where := fmt.Sprintf("key %s of Secret %s/%s", key, namespace, name)
			s.keep(where, string(value))
			cfg, err := clientcmd.Load(value)
			if err != nil {
				continue // not a kubeconfig
			}
			for user, auth := range cfg.AuthInfos {
				s.keep(where+", token of user "+user, auth.Token)
				s.keep(where+", client key of user "+user, string(auth.ClientKeyData))
				s.keep(where+", password of user "+user, auth.Password)
			}
		}
	}
}

// notSecret are keys of the Secrets above whose values the steps may print: a user name, and
// the space namespace, account name and apiserver a claim's connection Secret names beside
// its kubeconfig and token.
var notSecret = map[string]bool{"username": true, "namespace": true, "serviceaccount": true, "apiserver": true}

// keep notes a value, unless it is too short to mean anything when found in a log.
func (s secrets) keep(where, value string) {
	if len(strings.TrimSpace(value)) < 8 {
		return
	}
	s[where] = value
	s[where+", base64-encoded"] = base64.StdEncoding.EncodeToString([]byte(value))
}

// notIn fails the test if any of the secrets occurs in text (the output of what), naming the
// secret but never quoting it or the text.
func (s secrets) notIn(t *testing.T, what, text string) {
	t.Helper()
	if len(s) == 0 {
		t.Fatal("no secret values to look for: the check would prove nothing")
	}
	var leaked []string
	for where, value := range s {
		if strings.Contains(text, value) {
			leaked = append(leaked, where)
		}
	}
	slices.Sort(leaked)
	for _, where := range leaked {
		t.Errorf("%s shows the value of %s", what, where)
	}
	if len(leaked) > 0 {
		t.FailNow() // nothing after this may print the output
	}
}
