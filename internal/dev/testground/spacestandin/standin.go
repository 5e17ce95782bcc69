// Package spacestandin stands in for Konflux's space service, for tests and the dev stack, in
// both its APIs: the toolchain's SpaceRequest controller (the member cluster's) and the eaas
// Namespace claim that Crossplane serves with the eaas composition (what Konflux's own
// eaas-provision-space asks for since Dec 2024). Either way a tenant gets a namespace of its
// own, a ServiceAccount with admin rights in that namespace only, and a Secret in the tenant's
// namespace with a kubeconfig acting as that account by a real token from the TokenRequest API.
// Deleting the request or claim (or its owner, through the garbage collector) deletes the
// namespace and all in it.
//
// The claim's CRD is not the XRD's: ClaimCRD derives it from the real XRD as Crossplane does.
// The stand-in serves only what Options.Serve names, and only APIs the apiserver has the CRD
// of: the SpaceRequest CRD comes with the control plane (../shared/real/crds), the claim's
// from ClaimCRD.
//
// Everything the stand-in knows is on the objects: labels tie a space namespace and its access
// Secret to their request or claim, whose status says what was handed out. A restarted
// stand-in carries on where the last one stopped.
//
// It needs kube-controller-manager beside the apiserver (controlplane starts one unless told
// WithoutGarbageCollector): its namespace controller empties a deleted namespace, and its
// ClusterRole aggregator gives the built-in `admin` role, to which the account is bound, its
// rules.
package spacestandin

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/dev/testground/managerrun"
)

// API is one of the space service's APIs, or a set of them.
type API int

const (
	// SpaceRequests is toolchain.dev.openshift.com/v1alpha1 SpaceRequest.
	SpaceRequests API = 1 << iota
	// NamespaceClaims is eaas.konflux-ci.dev/v1alpha1 Namespace, a Crossplane claim.
	NamespaceClaims
	// BothAPIs is what the real cluster serves today.
	BothAPIs = SpaceRequests | NamespaceClaims
)

// Options configure a StandIn.
type Options struct {
	// Serve is the APIs the stand-in serves; zero serves both. The apiserver must have the CRD
	// of each.
	Serve API
	// APIServerURL is where tenants reach the apiserver: the server of the kubeconfigs handed
	// out and the status's targetClusterURL. Empty: the Host of the stand-in's rest.Config.
	APIServerURL string
	// CAData is the CA bundle (PEM) the kubeconfigs trust for it. Empty: the rest.Config's.
	CAData []byte
}

// StandIn serves SpaceRequests on one apiserver.
type StandIn struct {
	opts   Options
	client client.Client // uncached: every decision is made on what the apiserver holds now
	run    *managerrun.Run

	mu      sync.Mutex
	failing map[string]string // tier name → message
	stall   map[string]string // tenant namespace → message of the claims held there
}

// New prepares a stand-in acting with cfg, which needs to be a cluster admin (it creates
// namespaces, binds roles and requests tokens).
func New(cfg *rest.Config, opts Options) (*StandIn, error) {
	if opts.APIServerURL == "" {
		opts.APIServerURL = strings.TrimSuffix(cfg.Host, "/")
	}
	if len(opts.CAData) == 0 {
		ca, err := caData(cfg)
		if err != nil {
			return nil, err
		}
		opts.CAData = ca
	}
	if opts.Serve == 0 {
		opts.Serve = BothAPIs
	}
	run, c, err := managerrun.NewStandIn("space stand-in", cfg)
	if err != nil {
		return nil, err
	}
	s := &StandIn{opts: opts, client: c, run: run, failing: map[string]string{}, stall: map[string]string{}}
	controllers := []struct {
		api     API
		name    string
		kind    *unstructured.Unstructured
		ownerOf handler.MapFunc // the request or claim a namespace or Secret was made for
		do      reconcile.Func
	}{
		{SpaceRequests, "spacerequest-standin", newUnstructured(), requestOf, s.reconcile},
		{NamespaceClaims, "namespace-claim-standin", newClaimUnstructured(), claimOf, s.reconcileClaim},
	}
	for _, ctl := range controllers {
		if opts.Serve&ctl.api == 0 {
			continue
		}
		err = ctrl.NewControllerManagedBy(run.Manager()).
			Named(ctl.name).
			For(ctl.kind).
			// A space namespace that finishes deleting lets its owner's finalizer go; an access
			// Secret deleted by hand is made again.
			Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(ctl.ownerOf)).
			Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(ctl.ownerOf)).
			WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)}).
			Complete(ctl.do)
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// FailTier makes every SpaceRequest of tierName that has no namespace yet fail to provision:
// Ready=False, reason UnableToProvision, with message (a tier-not-found message if empty), as
// the real service reports a request it cannot serve.
func (s *StandIn) FailTier(tierName, message string) {
	if message == "" {
		message = fmt.Sprintf("nstemplatetiers.toolchain.dev.openshift.com %q not found", tierName)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing[tierName] = message
}

func (s *StandIn) tierFailure(tierName string) (string, bool) { return s.lookUp(s.failing, tierName) }

// lookUp reads one of the faults the tests set.
func (s *StandIn) lookUp(faults map[string]string, key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg, ok := faults[key]
	return msg, ok
}

// StallClaims holds every Namespace claim in the tenant namespace that has no namespace yet:
// Ready=False (Waiting), as Crossplane reports a claim whose composite never gets ready. With
// a message, Synced=False (ReconcileError) says it, as Crossplane reports a composition that
// fails.
func (s *StandIn) StallClaims(namespace, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stall[namespace] = message
}

func (s *StandIn) stalled(namespace string) (string, bool) { return s.lookUp(s.stall, namespace) }

// Start runs the stand-in in the background until ctx ends or Stop is called. It returns once
// the stand-in watches, so that a request made after it is served.
func (s *StandIn) Start(ctx context.Context) error {
	for _, api := range []struct {
		api     API
		gvk     schema.GroupVersionKind
		install string
	}{
		{SpaceRequests, spaceRequestGVK, "the real CRDs of ../shared/real/crds"},
		{NamespaceClaims, claimGVK, "spacestandin.ClaimCRD"},
	} {
		if s.opts.Serve&api.api != 0 {
			if err := s.checkServed(ctx, api.gvk, api.install); err != nil {
				return err
			}
		}
	}
	_, err := s.run.Start(ctx)
	return err
}

// checkServed fails unless the apiserver serves gvk: the stand-in serves an API, it does not
// install it.
func (s *StandIn) checkServed(ctx context.Context, gvk schema.GroupVersionKind, install string) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := s.client.List(ctx, list, client.Limit(1)); err != nil {
		return fmt.Errorf("space stand-in: the apiserver does not serve %s (install %s with the control plane): %w", gvk.Kind, install, err)
	}
	return nil
}

// Done is closed once the stand-in's manager has returned: after Stop, or when it failed. It is
// nil before Start.
func (s *StandIn) Done() <-chan struct{} { return s.run.Done() }

// Err says why the manager returned, once Done is closed.
func (s *StandIn) Err() error { return s.run.Err() }

// Stop stops the stand-in and waits for it. What it made stays; a new stand-in carries on.
func (s *StandIn) Stop() error { return s.run.Stop() }

// requestOf is the SpaceRequest a space namespace or access Secret was made for, by its labels.
func requestOf(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	namespace := l[labelSpaceRequestNamespace] // a namespace's
	if _, isSecret := obj.(*corev1.Secret); isSecret {
		namespace = obj.GetNamespace()
	}
	if l[labelSpaceRequest] == "" || namespace == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: namespace, Name: l[labelSpaceRequest]}}}
}

// claimOf is the Namespace claim a namespace (by its labels) or connection Secret (by its
// controller) was made for.
func claimOf(_ context.Context, obj client.Object) []reconcile.Request {
	if _, isSecret := obj.(*corev1.Secret); isSecret {
		ref := metav1.GetControllerOf(obj)
		if ref == nil || ref.APIVersion != claimGVK.GroupVersion().String() || ref.Kind != claimGVK.Kind {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}}
	}
	l := obj.GetLabels()
	if l[labelClaimName] == "" || l[labelClaimNamespace] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[labelClaimNamespace], Name: l[labelClaimName]}}}
}

// caData is the CA bundle of cfg, inline or from its file.
func caData(cfg *rest.Config) ([]byte, error) {
	c := rest.CopyConfig(cfg)
	if err := rest.LoadTLSFiles(c); err != nil {
		return nil, fmt.Errorf("space stand-in: reading the CA of its rest.Config: %w", err)
	}
	return c.CAData, nil
}
