package cluster

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Deprovision deletes a ClusterTemplateInstance, which makes the service tear the cluster
// down, and waits until it is gone. One that is gone already is deprovisioned.
func Deprovision(ctx context.Context, space *Space, name string, p Polling, progress io.Writer) error {
	ref := fmt.Sprintf("ClusterTemplateInstance %s/%s", space.Namespace, name)
	return deleteAndWait(ctx, space.Client, newObject(instanceGVK, space.Namespace, name), ref, p, progress)
}

// ReleaseSpace deletes a SpaceRequest, and with it the space namespace and everything in it,
// and waits until the SpaceRequest is gone. One that is gone already is released.
func ReleaseSpace(ctx context.Context, tenant client.Client, namespace, name string, p Polling, progress io.Writer) error {
	obj := newObject(spaceRequestGVK, namespace, name)
	return deleteAndWait(ctx, tenant, obj, describe(obj), p, progress)
}

// ReleaseClaim deletes an eaas Namespace claim, and with it the space namespace and everything
// in it, and waits until the claim is gone. One that is gone already is released.
func ReleaseClaim(ctx context.Context, tenant client.Client, namespace, name string, p Polling, progress io.Writer) error {
	obj := newObject(claimGVK, namespace, name)
	return deleteAndWait(ctx, tenant, obj, describe(obj), p, progress)
}

// deleteAndWait deletes an object (in the background: dependents go after it) and polls until
// it is gone, which with finalizers (the services clean up first) may take a while.
func deleteAndWait(ctx context.Context, c client.Client, obj *unstructured.Unstructured, ref string, p Polling, progress io.Writer) error {
	err := c.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if apierrors.IsNotFound(err) {
		fmt.Fprintf(progress, "%s is gone already\n", ref)
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting %s: %w", ref, err)
	}
	fmt.Fprintf(progress, "deleting %s\n", ref)
	start := time.Now()
	var finalizers []string
	err = poll(ctx, p, progress, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		finalizers = obj.GetFinalizers()
		return false, err
	})
	if isTimeout(err) {
		return fmt.Errorf("%s is still there %s after its deletion (finalizers: %s): the service has not finished cleaning up", ref, p.Timeout, strings.Join(finalizers, ", "))
	}
	if err != nil {
		return fmt.Errorf("waiting for %s to go: %w", ref, err)
	}
	fmt.Fprintf(progress, "[%s] %s is gone\n", elapsed(start), ref)
	return nil
}
