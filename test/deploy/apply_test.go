package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// fieldManager is who the test applies as, as kubectl apply --server-side is "kubectl".
const fieldManager = "deploy-test"

// `kubectl apply --server-side -k config/default` works on a real apiserver (with Tekton's CRDs,
// as the README asks), which validates every field of every object strictly; applying again
// changes nothing; and the objects fit together: the Deployment's ServiceAccount and the
// bindings' subjects exist, and the metrics Service selects the controller's pods.
func TestDefaultInstallsOnARealAPIServer(t *testing.T) {
	cp := startControlPlane(t)
	objs := render(t, defaultDir)
	applyAll(t, cp, objs)
	checkInstalled(t, cp, objs, makeImageRepository(t))
}

// checkInstalled checks that objs, applied to the control plane, fit together: one Deployment,
// the controller's, running image in every container under a ServiceAccount objs create; every
// Service selecting its pods and targeting a port it has; every binding's role there, and its
// ServiceAccounts too where they belong to the installation (in a namespace objs create).
func checkInstalled(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, image string) {
	t.Helper()
	ctx := context.Background()
	get := func(obj client.Object, namespace, name string) bool {
		t.Helper()
		err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
		if err != nil {
			t.Errorf("%T %s/%s: %v", obj, namespace, name, err)
		}
		return err == nil
	}
	deployments := ofKind[appsv1.Deployment](t, objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments, want the controller's", len(deployments))
	}
	var controller appsv1.Deployment
	if !get(&controller, deployments[0].Namespace, deployments[0].Name) {
		t.FailNow()
	}
	if sa := controller.Spec.Template.Spec.ServiceAccountName; sa == "" || !get(&corev1.ServiceAccount{}, controller.Namespace, sa) {
		t.Errorf("the controller runs as ServiceAccount %q, which is not installed", sa)
	}
	for _, c := range controller.Spec.Template.Spec.Containers {
		if c.Image != image {
			t.Errorf("container %s runs %s, not %s", c.Name, c.Image, image)
		}
	}
	for _, s := range ofKind[corev1.Service](t, objs, "Service") {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(controller.Spec.Template.Labels)) {
			t.Errorf("Service %s selects %v, not the controller's pods (%v)", s.Name, s.Spec.Selector, controller.Spec.Template.Labels)
		}
		for _, p := range s.Spec.Ports {
			if !hasPort(controller.Spec.Template.Spec.Containers, p.TargetPort) {
				t.Errorf("Service %s port %s targets %s, which no container of the controller has", s.Name, p.Name, p.TargetPort.String())
			}
		}
	}
	// A binding may name a ServiceAccount of another installation (config/prometheus binds
	// Prometheus's); those in namespaces objs create must be objs' own.
	own := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			own[o.GetName()] = true
		}
	}
	subjects := func(where string, list []rbacv1.Subject) {
		for _, s := range list {
			if s.Kind == rbacv1.ServiceAccountKind && own[s.Namespace] && !get(&corev1.ServiceAccount{}, s.Namespace, s.Name) {
				t.Errorf("%s binds ServiceAccount %s/%s, which is not installed", where, s.Namespace, s.Name)
			}
		}
	}
	for _, b := range ofKind[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding") {
		subjects("ClusterRoleBinding "+b.Name, b.Subjects)
		if b.RoleRef.Kind == "ClusterRole" {
			get(&rbacv1.ClusterRole{}, "", b.RoleRef.Name)
		}
	}
	for _, b := range ofKind[rbacv1.RoleBinding](t, objs, "RoleBinding") {
		subjects("RoleBinding "+b.Name, b.Subjects)
		if b.RoleRef.Kind == "Role" {
			get(&rbacv1.Role{}, b.Namespace, b.RoleRef.Name)
		}
	}
}

// applyAll applies objs to the control plane as `kubectl apply --server-side` does (CRDs and
// Namespaces first, strict field validation, each CRD established before what follows), then
// applies them all again and fails on any that changed: a manifest that differs from what the
// apiserver keeps is rewritten by every apply.
func applyAll(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	// kubectl's order: CRDs and Namespaces before what lives in them.
	first := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			return 0
		case "Namespace":
			return 1
		}
		return 2
	}
	var ordered []*unstructured.Unstructured
	for rank := range 3 {
		for _, o := range objs {
			if first(o) == rank {
				ordered = append(ordered, o)
			}
		}
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	apply := func(o *unstructured.Unstructured) *unstructured.Unstructured {
		t.Helper()
		gvk := o.GroupVersionKind()
		mapping, err := cp.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: the apiserver serves no such kind: %v", gvk, o.GetName(), err)
		}
		var resource dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			if o.GetNamespace() == "" {
				t.Fatalf("%s %s has no namespace", o.GetKind(), o.GetName())
			}
			resource = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		applied, err := resource.Patch(ctx, o.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: fieldManager, FieldValidation: metav1.FieldValidationStrict})
		if err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		return applied
	}

	versions := map[string]string{}
	for _, o := range ordered {
		applied := apply(o)
		versions[key(o)] = applied.GetResourceVersion()
		if o.GetKind() == "CustomResourceDefinition" {
			waitEstablished(t, dyn, o.GetName())
		}
	}
	t.Logf("applied %d objects", len(ordered))
	for _, o := range ordered {
		if rv := apply(o).GetResourceVersion(); rv != versions[key(o)] {
			t.Errorf("applying %s again changed it (resourceVersion %s → %s): the manifest differs from what the apiserver keeps, so every apply rewrites it", key(o), versions[key(o)], rv)
		}
	}
}

func key(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return fmt.Sprintf("%s %s", o.GetKind(), o.GetName())
	}
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// hasPort tells whether a Service's targetPort names or numbers a container port.
func hasPort(containers []corev1.Container, target intstr.IntOrString) bool {
	for _, c := range containers {
		for _, p := range c.Ports {
			if (target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && p.ContainerPort == target.IntVal) {
				return true
			}
		}
	}
	return false
}

// waitEstablished waits until the apiserver serves a CRD's kind.
func waitEstablished(t *testing.T, dyn *dynamic.DynamicClient, name string) {
	t.Helper()
	crds := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions"))
	for range 100 {
		u, err := crds.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &crd); err != nil {
			t.Fatal(err)
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("CRD %s never became established", name)
}
