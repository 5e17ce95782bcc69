// Package v1alpha1 holds berth's own records: the allocations it makes and the build hosts it
// serves from. They live only in the controller's namespace, where no tenant can write, and they
// are the only thing berth decides from: labels and annotations on a tenant's TaskRun are
// mirrors of them, rewritten when a tenant edits them, never read back.
//
// +kubebuilder:object:generate=true
// +groupName=berth.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// GroupVersion is berth.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "berth.dev", Version: "v1alpha1"}

var (
	// SchemeBuilder registers berth's record types.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	// AddToScheme adds them to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
