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
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Owner is the Tekton run a space lives as long as: the SpaceRequest carries an owner
// reference to it, so the garbage collector deletes the space with the run.
type Owner struct {
	// Kind is PipelineRun or TaskRun (tekton.dev/v1).
	Kind string
	Name string
	UID  types.UID
}

// SpaceRequest asks the space service for a namespace in the tenant's namespace.
type SpaceRequest struct {
	// Namespace is the tenant namespace the SpaceRequest is made in.
	Namespace string
	// Name is the SpaceRequest's name; a re-run with the same name reuses the request.
	Name string
	// TierName is the space tier (spec.tierName).
	TierName string
	Owner    Owner
}

// SpaceAccess is a ready space: its namespace and the Secret in the tenant namespace whose
// key "kubeconfig" acts with admin rights there.
type SpaceAccess struct {
	// Namespace is the space namespace.
	Namespace string
	// TenantNamespace holds the SpaceRequest and the Secret.
	TenantNamespace string
	SecretName      string
	// ClusterURL is the apiserver the space lives on (informative).
	ClusterURL string
}

const tektonAPIVersion = "tekton.dev/v1"

// reasons of a SpaceRequest's Ready=False that mean "not yet" rather than "never".
var spaceInProgress = map[string]bool{"": true, "Provisioning": true, "Updating": true}

// ProvisionSpace creates the SpaceRequest (or reuses one of the same name and tier), waits
// until it is Ready and returns the access it grants. Ready=False with a reason other than
// Provisioning or Updating fails at once with the service's message.
func ProvisionSpace(ctx context.Context, tenant client.Client, req SpaceRequest, p Polling, progress io.Writer) (SpaceAccess, error) {
	if err := req.validate(); err != nil {
		return SpaceAccess{}, err
	}
	if err := checkOwner(ctx, tenant, req); err != nil {
		return SpaceAccess{}, err
	}
	if err := ensureSpaceRequest(ctx, tenant, req, progress); err != nil {
		return SpaceAccess{}, err
	}
	ref := fmt.Sprintf("SpaceRequest %s/%s", req.Namespace, req.Name)
	var (
		access   SpaceAccess
		lastLine string
		start    = time.Now()
	)
	err := poll(ctx, p, progress, func(ctx context.Context) (bool, error) {
		u := newObject(spaceRequestGVK, req.Namespace, req.Name)
		if err := tenant.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
			if apierrors.IsNotFound(err) {
				return false, fmt.Errorf("%s is gone: it was deleted while berth waited for it (with its owner %s %s?)", ref, req.Owner.Kind, req.Owner.Name)
			}
			return false, err
		}
		sr, err := decode[spaceRequestView](u)
		if err != nil {
			return false, err
		}
		ready := sr.ready()
		if line := ready.describe(); line != lastLine {
			fmt.Fprintf(progress, "[%s] %s: Ready=%s\n", elapsed(start), ref, line)
			lastLine = line
		}
		switch {
		case ready.status == "True" && len(sr.Status.NamespaceAccess) > 0:
			granted := sr.Status.NamespaceAccess[0]
			access = SpaceAccess{Namespace: granted.Name, TenantNamespace: req.Namespace, SecretName: granted.SecretRef, ClusterURL: sr.Status.TargetClusterURL}
			return true, nil
		case ready.status == "False" && !spaceInProgress[ready.reason]:
			return false, fmt.Errorf("the space service cannot serve %s: %s", ref, ready.describe())
		}
		return false, nil
	})
	if isTimeout(err) {
		return SpaceAccess{}, fmt.Errorf("%s is not ready after %s (Ready=%s); the space service has not served it", ref, p.Timeout, lastLine)
	}
	if err != nil {
		return SpaceAccess{}, err
	}
	if access.SecretName == "" {
		return SpaceAccess{}, fmt.Errorf("%s is ready but names no Secret for namespace %s", ref, access.Namespace)
	}
	return access, nil
}

// readiness is a SpaceRequest's Ready condition.
type readiness struct{ status, reason, message string }

func (sr spaceRequestView) ready() readiness {
	for _, c := range sr.Status.Conditions {
		if c.Type == "Ready" {
			return readiness{c.Status, c.Reason, c.Message}
		}
	}
	return readiness{status: "Unknown"}
}

func (r readiness) describe() string {
	s := r.status
	if r.reason != "" {
		s += " (" + r.reason + ")"
	}
	return s + messageSuffix(r.message)
}

func (r SpaceRequest) validate() error {
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"namespace", r.Namespace}, {"name", r.Name}, {"tier name", r.TierName},
		{"owner name", r.Owner.Name}, {"owner UID", string(r.Owner.UID)},
	} {
		if strings.TrimSpace(f.value) == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a SpaceRequest needs: %s", strings.Join(missing, ", "))
	}
	if r.Owner.Kind != "PipelineRun" && r.Owner.Kind != "TaskRun" {
		return fmt.Errorf("the owner of a space is a PipelineRun or a TaskRun, not %q", r.Owner.Kind)
	}
	return nil
}

// checkOwner makes sure the owner reference points at the run that exists: one with a wrong
// UID would have the garbage collector delete the SpaceRequest at once. A tenant whose
// ServiceAccount may not read runs gets no check.
func checkOwner(ctx context.Context, tenant client.Client, req SpaceRequest) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(tektonAPIVersion)
	u.SetKind(req.Owner.Kind)
	err := tenant.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Owner.Name}, u)
	switch {
	case apierrors.IsForbidden(err):
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("the owner %s %s/%s does not exist; a space owned by it would be deleted at once", req.Owner.Kind, req.Namespace, req.Owner.Name)
	case err != nil:
		return fmt.Errorf("reading the owner %s %s/%s: %w", req.Owner.Kind, req.Namespace, req.Owner.Name, err)
	case u.GetUID() != req.Owner.UID:
		return fmt.Errorf("the owner %s %s/%s has UID %s, not %s; a space owned by the wrong UID would be deleted at once", req.Owner.Kind, req.Namespace, req.Owner.Name, u.GetUID(), req.Owner.UID)
	}
	return nil
}

func ensureSpaceRequest(ctx context.Context, tenant client.Client, req SpaceRequest, progress io.Writer) error {
	u := newObject(spaceRequestGVK, req.Namespace, req.Name)
	u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: tektonAPIVersion, Kind: req.Owner.Kind, Name: req.Owner.Name, UID: req.Owner.UID}})
	if err := unstructured.SetNestedField(u.Object, req.TierName, "spec", "tierName"); err != nil {
		return err
	}
	err := tenant.Create(ctx, u)
	if err == nil {
		fmt.Fprintf(progress, "created SpaceRequest %s/%s (tier %s, owned by %s %s)\n", req.Namespace, req.Name, req.TierName, req.Owner.Kind, req.Owner.Name)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating SpaceRequest %s/%s: %w", req.Namespace, req.Name, err)
	}
	existing := newObject(spaceRequestGVK, req.Namespace, req.Name)
	if err := tenant.Get(ctx, client.ObjectKeyFromObject(existing), existing); err != nil {
		return fmt.Errorf("reading the existing SpaceRequest %s/%s: %w", req.Namespace, req.Name, err)
	}
	sr, err := decode[spaceRequestView](existing)
	if err != nil {
		return err
	}
	if sr.DeletionTimestamp != nil {
		return fmt.Errorf("SpaceRequest %s/%s is being deleted; run again once it is gone, or choose another name", req.Namespace, req.Name)
	}
	if sr.Spec.TierName != req.TierName {
		return fmt.Errorf("SpaceRequest %s/%s exists with tier %s, not %s; delete it or choose another name", req.Namespace, req.Name, sr.Spec.TierName, req.TierName)
	}
	fmt.Fprintf(progress, "reusing SpaceRequest %s/%s (tier %s)\n", req.Namespace, req.Name, req.TierName)
	return nil
}
