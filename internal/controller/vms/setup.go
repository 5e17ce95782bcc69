package vms

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
)

// SetupWithManager registers the VM loop and the planner.
func (f *Fleet) SetupWithManager(mgr ctrl.Manager) error {
	f.init()
	if f.APIReader == nil {
		f.APIReader = mgr.GetAPIReader()
	}
	f.Config.OnChange(f.configChanged)
	if err := ctrl.NewControllerManagedBy(mgr).
		Named("vm").
		For(&berthv1.BuildHost{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*berthv1.BuildHost).Spec.Instance != nil
		}))).
		Complete(f); err != nil {
		return err
	}
	return mgr.Add(f)
}
