// Package cluster is the client side of ephemeral clusters for integration pipelines: it asks
// a space service for a throwaway namespace (an eaas Namespace claim or a SpaceRequest), asks the cluster-templates
// service in that namespace for a cluster (a ClusterTemplateInstance), waits for it, explains
// a failure, hands out its credentials and gives it all back. Each exported function is one
// step of a Tekton Task (berth cluster …) with its inputs spelled out.
//
// The services' types are not compiled in: objects travel as unstructured and are read through
// the small structs below, which name only the fields the steps use. Nothing here prints a
// kubeconfig, token or password.
package cluster

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	spaceRequestGVK = schema.GroupVersionKind{Group: "toolchain.dev.openshift.com", Version: "v1alpha1", Kind: "SpaceRequest"}
	// claimGVK is the eaas Namespace claim, served by Crossplane from the eaas XRD.
	claimGVK    = schema.GroupVersionKind{Group: "eaas.konflux-ci.dev", Version: "v1alpha1", Kind: "Namespace"}
	instanceGVK = schema.GroupVersionKind{Group: "clustertemplate.openshift.io", Version: "v1alpha1", Kind: "ClusterTemplateInstance"}
	templateGVK = schema.GroupVersionKind{Group: "clustertemplate.openshift.io", Version: "v1alpha1", Kind: "ClusterTemplate"}
	quotaGVK    = schema.GroupVersionKind{Group: "clustertemplate.openshift.io", Version: "v1alpha1", Kind: "ClusterTemplateQuota"}
)

// Keys of the Secrets the services write.
const (
	kubeconfigKey = "kubeconfig"
	usernameKey   = "username"
	passwordKey   = "password"
)

// credentialsParameter is the template parameter that names the Secret in the space namespace
// holding a bring-your-own-cloud template's cloud credentials.
const credentialsParameter = "credentialsSecret"

// newObject is an empty unstructured object of a kind, for Get, Create and Delete.
func newObject(gvk schema.GroupVersionKind, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

func newList(gvk schema.GroupVersionKind) *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return l
}

// decode reads an unstructured object into one of the views below.
func decode[T any](u *unstructured.Unstructured) (T, error) {
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &v); err != nil {
		return v, fmt.Errorf("reading %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return v, nil
}

// spaceRequestView is what the steps read of a SpaceRequest (toolchain.dev.openshift.com).
type spaceRequestView struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		TierName string `json:"tierName"`
	} `json:"spec"`
	Status struct {
		TargetClusterURL string `json:"targetClusterURL,omitempty"`
		NamespaceAccess  []struct {
			Name      string `json:"name"`
			SecretRef string `json:"secretRef"`
		} `json:"namespaceAccess,omitempty"`
		Conditions []serviceCondition `json:"conditions,omitempty"`
	} `json:"status"`
}

// claimView is what the steps read of an eaas Namespace claim (a Crossplane claim).
type claimView struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		WriteConnectionSecretToRef *localRef `json:"writeConnectionSecretToRef,omitempty"`
	} `json:"spec"`
	Status struct {
		Conditions []serviceCondition `json:"conditions,omitempty"`
	} `json:"status"`
}

// serviceCondition is a condition as the space services write them: the toolchain's carry no
// observedGeneration and an optional reason, Crossplane's no observedGeneration either, unlike
// metav1.Condition.
type serviceCondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// instanceView is what the steps read of a ClusterTemplateInstance.
type instanceView struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ClusterTemplateRef string      `json:"clusterTemplateRef"`
		Parameters         []Parameter `json:"parameters,omitempty"`
	} `json:"spec"`
	Status struct {
		Phase         string             `json:"phase,omitempty"`
		Message       string             `json:"message,omitempty"`
		Conditions    []metav1.Condition `json:"conditions,omitempty"`
		APIServerURL  string             `json:"apiServerURL,omitempty"`
		Kubeconfig    *localRef          `json:"kubeconfig,omitempty"`
		AdminPassword *localRef          `json:"adminPassword,omitempty"`
	} `json:"status"`
}

type localRef struct {
	Name string `json:"name"`
}

func (r *localRef) name() string {
	if r == nil {
		return ""
	}
	return r.Name
}

// templateView is what the steps read of a (cluster-scoped) ClusterTemplate.
type templateView struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Cost int64 `json:"cost,omitempty"`
	} `json:"spec"`
}

// quotaView is what the steps read of a ClusterTemplateQuota.
type quotaView struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		AllowedTemplates []struct {
			Name  string `json:"name"`
			Count int64  `json:"count,omitempty"`
		} `json:"allowedTemplates"`
		Budget int64 `json:"budget,omitempty"`
	} `json:"spec"`
	Status struct {
		BudgetSpent       int64 `json:"budgetSpent,omitempty"`
		TemplateInstances []struct {
			Name  string `json:"name"`
			Count int64  `json:"count"`
		} `json:"templateInstances,omitempty"`
	} `json:"status"`
}
