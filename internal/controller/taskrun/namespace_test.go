//go:build stack

package taskrun_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// A team deletes its namespace while its builds run, on a cluster whose garbage collector and
// namespace controller are at work: berth's finalizer must not hold the namespace, and the
// build user still goes from the host.
func TestDeletedNamespaceWithRunningTasksIsGone(t *testing.T) {
	if !stack.ControlPlane.CollectsGarbage() {
		t.Fatal("the stack runs no kube-controller-manager: a deleted namespace would never go")
	}
	applyConfig(t, 2, nil)
	ns := namespace(t)
	remote := create(t, userTaskRun(ns, "remote", platform, ""))
	local := create(t, userTaskRun(ns, "local", "linux/amd64", ""))
	rec := stacktest.Ready(t, c(), remote)
	secretOf(t, remote)
	secretOf(t, local)
	eventually(t, "the remote task carries berth's finalizer", func() (bool, error) {
		return controllerutil.ContainsFinalizer(get(t, remote), contract.Finalizer), nil
	})

	namespaceObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := c().Delete(context.Background(), namespaceObj); err != nil {
		t.Fatal(err)
	}
	eventually(t, "namespace "+ns+" is gone", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKeyFromObject(namespaceObj), namespaceObj)
		if err == nil {
			return false, nil
		}
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	eventually(t, "the remote task's record is gone", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: rec.Name}, &berthv1.Allocation{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	noBuildUsersLeft(t)
}
