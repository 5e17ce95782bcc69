// Package kubescheme is the set of API types berth talks in: core Kubernetes, Tekton v1 and berth's records.
package kubescheme

import (
	berthv1alpha1 "github.com/berth-ci/berth/api/v1alpha1"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// New returns a scheme with core Kubernetes, Tekton v1 and berth's record types.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err) // only a programming error in the static type registrations
	}
	if err := pipelinev1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := berthv1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}
