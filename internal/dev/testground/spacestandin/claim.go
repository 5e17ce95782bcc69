package spacestandin

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The names below are Crossplane's own, so that a claim served by the stand-in looks as one
// served by Crossplane and the eaas composition does.
const (
	// claimFinalizer holds a claim until its namespace is gone.
	claimFinalizer = "finalizer.apiextensions.crossplane.io"
	// labelClaimName and labelClaimNamespace mark what is composed for a claim (the namespace
	// here); they, not memory, tie a namespace to its claim across restarts.
	labelClaimName      = "crossplane.io/claim-name"
	labelClaimNamespace = "crossplane.io/claim-namespace"
	// connectionSecretType is the type Crossplane gives the Secrets it writes connection
	// details to.
	connectionSecretType = "connection.crossplane.io/v1alpha1"

	conditionSynced = "Synced"

	reasonReconcileSuccess = "ReconcileSuccess"
	reasonReconcileError   = "ReconcileError"
	reasonAvailable        = "Available"
	reasonWaiting          = "Waiting"
	reasonDeleting         = "Deleting"

	// waitingMessage is what Crossplane says on a claim whose composite is not ready yet.
	waitingMessage = "Composite resource claim is waiting for composite resource to become Ready"
)

// Keys of the connection Secret, as the eaas composition writes them.
const (
	keyKubeconfig     = "kubeconfig"
	keyNamespace      = "namespace"
	keyServiceAccount = "serviceaccount"
	keyToken          = "token"
	keyAPIServer      = "apiserver"
)

var claimGVK = schema.GroupVersionKind{Group: "eaas.konflux-ci.dev", Version: "v1alpha1", Kind: "Namespace"}

// claim is the part of an eaas Namespace claim the stand-in reads and writes.
type claim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		WriteConnectionSecretToRef *struct {
			Name string `json:"name"`
		} `json:"writeConnectionSecretToRef,omitempty"`
	} `json:"spec"`
	Status claimStatus `json:"status,omitempty"`
}

type claimStatus struct {
	Conditions        []condition        `json:"conditions,omitempty"`
	ConnectionDetails *connectionDetails `json:"connectionDetails,omitempty"`
}

type connectionDetails struct {
	LastPublishedTime *metav1.Time `json:"lastPublishedTime,omitempty"`
}

// secretName is the connection Secret the claim asks for, or "".
func (c *claim) secretName() string {
	if c.Spec.WriteConnectionSecretToRef == nil {
		return ""
	}
	return c.Spec.WriteConnectionSecretToRef.Name
}

func newClaimUnstructured() *unstructured.Unstructured { return newObject(claimGVK) }

func claimFromUnstructured(u *unstructured.Unstructured) (*claim, error) {
	return decode[claim](u, "Namespace claim")
}

// with returns a copy of s whose Synced and Ready conditions are as given, as Crossplane sets
// them: Synced says whether the last reconcile worked, Ready whether the composite is ready.
func (s claimStatus) with(synced, syncedReason, syncedMessage, ready, readyReason, readyMessage string) claimStatus {
	out := s
	// Crossplane's conditions have no update time: only the transition time is kept.
	out.Conditions = withCondition(s.Conditions, condition{Type: conditionSynced, Status: synced, Reason: syncedReason, Message: syncedMessage}, false)
	out.Conditions = withCondition(out.Conditions, condition{Type: conditionReady, Status: ready, Reason: readyReason, Message: readyMessage}, false)
	return out
}
