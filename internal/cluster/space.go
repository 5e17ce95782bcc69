package cluster

import (
	"context"
	"errors"
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

// Owner is the Tekton run a space lives as long as: the SpaceRequest or claim carries an owner
// reference to it, so the garbage collector deletes the space with the run.
type Owner struct {
	// Kind is PipelineRun or TaskRun (tekton.dev/v1).
	Kind string
	Name string
	UID  types.UID
}

// SpaceRequest is what a step asks of the space service: a namespace for a run, asked for with
// a SpaceRequest or an eaas Namespace claim in the tenant's namespace.
type SpaceRequest struct {
	// Namespace is the tenant namespace the SpaceRequest or claim is made in.
	Namespace string
	// Name is the SpaceRequest's or claim's name; a re-run with the same name reuses it.
	Name string
	// TierName is the space tier (a SpaceRequest's spec.tierName); a claim has none.
	TierName string
	Owner    Owner
	// API is the API to ask with; empty is auto.
	API SpaceAPI
}

// SpaceAccess is a ready space: its namespace and the Secret in the tenant namespace whose
// key "kubeconfig" acts with admin rights there.
type SpaceAccess struct {
	// Namespace is the space namespace.
	Namespace string
	// TenantNamespace holds the SpaceRequest or claim and the Secret.
	TenantNamespace string
	SecretName      string
	// ClusterURL is the apiserver the space lives on (informative).
	ClusterURL string
}

const tektonAPIVersion = "tekton.dev/v1"

// reasons of a SpaceRequest's Ready=False that mean "not yet" rather than "never".
var spaceInProgress = map[string]bool{"": true, "Provisioning": true, "Updating": true}

// ProvisionSpace asks for a space with the API req names (auto: the one the cluster serves, the
// claim where it serves both; the progress says which and why), or reuses the SpaceRequest or
// claim of the same name on a re-run, waits until it is Ready and returns the access it grants.
// A SpaceRequest that is Ready=False for a reason other than Provisioning or Updating fails at
// once with the service's message; a claim is waited for while Crossplane retries it, and a
// timeout names its Ready and Synced conditions.
func ProvisionSpace(ctx context.Context, tenant client.Client, req SpaceRequest, p Polling, progress io.Writer) (SpaceAccess, error) {
	if err := req.validate(); err != nil {
		return SpaceAccess{}, err
	}
	served, err := servedSpaceAPIs(tenant.RESTMapper())
	if err != nil {
		return SpaceAccess{}, err
	}
	api, why, err := ChooseSpaceAPI(req.API, served)
	if err != nil {
		return SpaceAccess{}, err
	}
	fmt.Fprintf(progress, "asking with %s: %s\n", api, why)
	if api == SpaceAPISpaceRequest && strings.TrimSpace(req.TierName) == "" {
		return SpaceAccess{}, errors.New("a SpaceRequest needs a tier name")
	}
	if err := checkOwner(ctx, tenant, req); err != nil {
		return SpaceAccess{}, err
	}
	if api == SpaceAPIClaim {
		return provisionClaim(ctx, tenant, req, p, progress)
	}
	return provisionSpaceRequest(ctx, tenant, req, p, progress)
}

func provisionSpaceRequest(ctx context.Context, tenant client.Client, req SpaceRequest, p Polling, progress io.Writer) (SpaceAccess, error) {
	obj := newObject(spaceRequestGVK, req.Namespace, req.Name)
	obj.SetOwnerReferences(req.Owner.references())
	if err := unstructured.SetNestedField(obj.Object, req.TierName, "spec", "tierName"); err != nil {
		return SpaceAccess{}, err
	}
	detail := fmt.Sprintf("tier %s, owned by %s %s", req.TierName, req.Owner.Kind, req.Owner.Name)
	err := createOrReuse(ctx, tenant, obj, detail, progress, func(existing *unstructured.Unstructured) (string, error) {
		sr, err := decode[spaceRequestView](existing)
		if err != nil || sr.Spec.TierName == req.TierName {
			return "", err
		}
		return fmt.Sprintf("tier %s, not %s", sr.Spec.TierName, req.TierName), nil
	})
	if err != nil {
		return SpaceAccess{}, err
	}
	ref := describe(obj)
	fmt.Fprintf(progress, "waiting for %s to be Ready: the space service makes the namespace and a Secret with its kubeconfig\n", ref)
	return awaitSpace(ctx, tenant, obj, req.Owner, p, progress, func(_ context.Context, u *unstructured.Unstructured) (spaceLook, error) {
		sr, err := decode[spaceRequestView](u)
		if err != nil {
			return spaceLook{}, err
		}
		ready := findCondition(sr.Status.Conditions, "Ready")
		look := spaceLook{state: "Ready=" + ready.describe()}
		switch {
		case ready.status == "True" && len(sr.Status.NamespaceAccess) > 0:
			granted := sr.Status.NamespaceAccess[0]
			if granted.SecretRef == "" {
				return look, fmt.Errorf("%s is ready but names no Secret for namespace %s", ref, granted.Name)
			}
			look.access = &SpaceAccess{Namespace: granted.Name, TenantNamespace: req.Namespace, SecretName: granted.SecretRef, ClusterURL: sr.Status.TargetClusterURL}
		case ready.status == "False" && !spaceInProgress[ready.reason]:
			look.refused = ready.describe()
		}
		return look, nil
	})
}

// spaceLook is where a SpaceRequest or claim stands at one look.
type spaceLook struct {
	// state is what the progress shows of it: its conditions and what it still waits for.
	state string
	// access is the space, once it is ready.
	access *SpaceAccess
	// refused says why the service will never serve it, if it says so.
	refused string
}

// awaitSpace polls obj, the SpaceRequest or claim of a space owned by owner, until look finds
// the space ready or refused, writing a line to progress whenever its state changes.
func awaitSpace(ctx context.Context, tenant client.Client, obj *unstructured.Unstructured, owner Owner, p Polling, progress io.Writer,
	look func(context.Context, *unstructured.Unstructured) (spaceLook, error)) (SpaceAccess, error) {
	ref := describe(obj)
	var (
		access   SpaceAccess
		lastLine string
		start    = time.Now()
	)
	err := poll(ctx, p, progress, func(ctx context.Context) (bool, error) {
		u := newObject(obj.GroupVersionKind(), obj.GetNamespace(), obj.GetName())
		if err := tenant.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
			if apierrors.IsNotFound(err) {
				return false, fmt.Errorf("%s is gone: it was deleted while berth waited for it (with its owner %s %s?)", ref, owner.Kind, owner.Name)
			}
			return false, err
		}
		l, err := look(ctx, u)
		if err != nil {
			return false, err
		}
		if l.state != lastLine {
			fmt.Fprintf(progress, "[%s] %s: %s\n", elapsed(start), ref, l.state)
			lastLine = l.state
		}
		switch {
		case l.access != nil:
			access = *l.access
			return true, nil
		case l.refused != "":
			return false, fmt.Errorf("the space service cannot serve %s: %s", ref, l.refused)
		}
		return false, nil
	})
	if isTimeout(err) {
		return SpaceAccess{}, fmt.Errorf("%s is not ready after %s (%s); the space service has not served it", ref, p.Timeout, lastLine)
	}
	return access, err
}

// describe names a SpaceRequest or claim for a person: a claim's kind alone, Namespace, reads
// as a core namespace.
func describe(obj *unstructured.Unstructured) string {
	kind := obj.GetKind()
	if obj.GroupVersionKind() == claimGVK {
		kind = "Namespace claim"
	}
	return fmt.Sprintf("%s %s/%s", kind, obj.GetNamespace(), obj.GetName())
}

// readiness is a condition of a SpaceRequest or claim.
type readiness struct{ status, reason, message string }

// findCondition is the condition of a type, status Unknown if there is none.
func findCondition(conds []serviceCondition, typ string) readiness {
	for _, c := range conds {
		if c.Type == typ {
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
		{"namespace", r.Namespace}, {"name", r.Name},
		{"owner name", r.Owner.Name}, {"owner UID", string(r.Owner.UID)},
	} {
		if strings.TrimSpace(f.value) == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a space needs: %s", strings.Join(missing, ", "))
	}
	if r.Owner.Kind != "PipelineRun" && r.Owner.Kind != "TaskRun" {
		return fmt.Errorf("the owner of a space is a PipelineRun or a TaskRun, not %q", r.Owner.Kind)
	}
	_, err := ParseSpaceAPI(string(r.API))
	return err
}

// references are the owner references of a SpaceRequest or claim owned by o, as Konflux's Task
// writes them.
func (o Owner) references() []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: tektonAPIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID}}
}

// checkOwner makes sure the owner reference points at the run that exists: one with a wrong
// UID would have the garbage collector delete the SpaceRequest or claim at once. A tenant whose
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

// createOrReuse creates obj, a SpaceRequest or claim, or on a re-run reuses the one of its name,
// unless that one is going or differs says how it asks for something else.
func createOrReuse(ctx context.Context, tenant client.Client, obj *unstructured.Unstructured, detail string, progress io.Writer,
	differs func(existing *unstructured.Unstructured) (string, error)) error {
	ref := describe(obj)
	err := tenant.Create(ctx, obj)
	if err == nil {
		fmt.Fprintf(progress, "created %s (%s)\n", ref, detail)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s: %w", ref, err)
	}
	existing := newObject(obj.GroupVersionKind(), obj.GetNamespace(), obj.GetName())
	if err := tenant.Get(ctx, client.ObjectKeyFromObject(existing), existing); err != nil {
		return fmt.Errorf("reading the existing %s: %w", ref, err)
	}
	if existing.GetDeletionTimestamp() != nil {
		return fmt.Errorf("%s is being deleted; run again once it is gone, or choose another name", ref)
	}
	switch other, err := differs(existing); {
	case err != nil:
		return err
	case other != "":
		return fmt.Errorf("%s exists with %s; delete it or choose another name", ref, other)
	}
	fmt.Fprintf(progress, "reusing %s (%s)\n", ref, detail)
	return nil
}
