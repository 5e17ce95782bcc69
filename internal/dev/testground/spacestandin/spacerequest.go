package spacestandin

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The names below are the toolchain's own (codeready-toolchain/api), so that what a tenant sees
// on the objects is what the real member cluster shows.
const (
	labelPrefix = "toolchain.dev.openshift.com/"
	// labelSpaceRequest and labelSpaceRequestNamespace mark the space namespace with the request
	// it serves; they, not memory, tie a namespace to its request across restarts.
	labelSpaceRequest          = labelPrefix + "spacerequest"
	labelSpaceRequestNamespace = labelPrefix + "spacerequest-namespace"
	// labelProvisionedNamespace marks the access Secret with the namespace it grants.
	labelProvisionedNamespace = labelPrefix + "spacerequest-provisioned-namespace"
	labelSpace                = labelPrefix + "space"
	labelTier                 = labelPrefix + "tier"

	finalizer = "finalizer.toolchain.dev.openshift.com"
	// serviceAccountName is the account whose token the access Secret holds.
	serviceAccountName = "namespace-manager"

	conditionReady = "Ready"

	reasonProvisioning      = "Provisioning"
	reasonProvisioned       = "Provisioned"
	reasonUnableToProvision = "UnableToProvision"
	reasonTerminating       = "Terminating"
)

var spaceRequestGVK = schema.GroupVersionKind{Group: "toolchain.dev.openshift.com", Version: "v1alpha1", Kind: "SpaceRequest"}

// spaceRequest is the part of a SpaceRequest the stand-in reads and writes. The stand-in talks
// to the apiserver in unstructured objects so that it needs no generated code for a CRD it does
// not own; this is their typed view.
type spaceRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		TierName string `json:"tierName"`
	} `json:"spec"`
	Status spaceRequestStatus `json:"status,omitempty"`
}

type spaceRequestStatus struct {
	TargetClusterURL string            `json:"targetClusterURL,omitempty"`
	NamespaceAccess  []namespaceAccess `json:"namespaceAccess,omitempty"`
	Conditions       []condition       `json:"conditions,omitempty"`
}

type namespaceAccess struct {
	Name      string `json:"name"`
	SecretRef string `json:"secretRef"`
}

// condition is the toolchain's condition, which differs from metav1.Condition (an optional
// reason and message, a lastUpdatedTime).
type condition struct {
	Type               string       `json:"type"`
	Status             string       `json:"status"`
	Reason             string       `json:"reason,omitempty"`
	Message            string       `json:"message,omitempty"`
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	LastUpdatedTime    *metav1.Time `json:"lastUpdatedTime,omitempty"`
}

func newUnstructured() *unstructured.Unstructured { return newObject(spaceRequestGVK) }

func fromUnstructured(u *unstructured.Unstructured) (*spaceRequest, error) {
	return decode[spaceRequest](u, "SpaceRequest")
}

// newObject is an empty object of a kind the stand-in serves, for the apiserver to fill.
func newObject(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

// decode reads u into the stand-in's typed view of its kind; what names the kind in errors.
func decode[T any](u *unstructured.Unstructured, what string) (*T, error) {
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &v); err != nil {
		return nil, fmt.Errorf("reading %s %s/%s: %w", what, u.GetNamespace(), u.GetName(), err)
	}
	return &v, nil
}

// setStatus puts status (a spaceRequestStatus or claimStatus) into u, for an update of the
// status subresource.
func setStatus(u *unstructured.Unstructured, status any) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	u.Object["status"] = obj
	return nil
}

// ready returns the Ready condition, or nil.
func (s spaceRequestStatus) ready() *condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == conditionReady {
			return &s.Conditions[i]
		}
	}
	return nil
}

// withReady returns a copy of s whose Ready condition is set as given.
func (s spaceRequestStatus) withReady(status, reason, message string) spaceRequestStatus {
	out := s
	out.Conditions = withCondition(s.Conditions, condition{Type: conditionReady, Status: status, Reason: reason, Message: message}, true)
	return out
}

// withCondition returns conds with c in place of the condition of its type, stamped now but
// keeping the old times of an unchanged condition, so that an unchanged status is written no
// more, and its transition time while only the reason or message moves. Only the toolchain's
// conditions have an update time (stampUpdate).
func withCondition(conds []condition, c condition, stampUpdate bool) []condition {
	now := metav1.Now()
	c.LastTransitionTime = &now
	if stampUpdate {
		c.LastUpdatedTime = &now
	}
	var out []condition
	for _, old := range conds {
		if old.Type != c.Type {
			out = append(out, old)
			continue
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
			if stampUpdate && old.Reason == c.Reason && old.Message == c.Message {
				c.LastUpdatedTime = old.LastUpdatedTime
			}
		}
	}
	return append(out, c)
}
