// Package spacestandin stands in for the toolchain's SpaceRequest controller (the Konflux
// member cluster's), for tests and the dev stack: a SpaceRequest in a tenant's namespace gets a
// namespace of its own, a ServiceAccount with admin rights in that namespace only, and a Secret
// in the tenant's namespace with a kubeconfig acting as that account by a real token from the
// TokenRequest API. Deleting the request deletes the namespace and all in it.
//
// Everything the stand-in knows is on the objects: labels tie a space namespace and its access
// Secret to their request, the request's status says what was handed out. A restarted stand-in
// carries on where the last one stopped.
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

// Options configure a StandIn.
type Options struct {
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
	run, c, err := managerrun.NewStandIn("space stand-in", cfg)
	if err != nil {
		return nil, err
	}
	s := &StandIn{opts: opts, client: c, run: run, failing: map[string]string{}}
	err = ctrl.NewControllerManagedBy(run.Manager()).
		Named("spacerequest-standin").
		For(newUnstructured()).
		// A space namespace that finishes deleting lets its request's finalizer go; an access
		// Secret deleted by hand is made again.
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(requestOfNamespace)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(requestOfSecret)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)}).
		Complete(reconcile.Func(s.reconcile))
	if err != nil {
		return nil, err
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

func (s *StandIn) tierFailure(tierName string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg, ok := s.failing[tierName]
	return msg, ok
}

// Start runs the stand-in in the background until ctx ends or Stop is called. It returns once
// the stand-in watches, so that a request made after it is served.
func (s *StandIn) Start(ctx context.Context) error {
	_, err := s.run.Start(ctx)
	return err
}

// Done is closed once the stand-in's manager has returned: after Stop, or when it failed. It is
// nil before Start.
func (s *StandIn) Done() <-chan struct{} { return s.run.Done() }

// Err says why the manager returned, once Done is closed.
func (s *StandIn) Err() error { return s.run.Err() }

// Stop stops the stand-in and waits for it. What it made stays; a new stand-in carries on.
func (s *StandIn) Stop() error { return s.run.Stop() }

func requestOfNamespace(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	if l[labelSpaceRequest] == "" || l[labelSpaceRequestNamespace] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[labelSpaceRequestNamespace], Name: l[labelSpaceRequest]}}}
}

func requestOfSecret(_ context.Context, obj client.Object) []reconcile.Request {
	name := obj.GetLabels()[labelSpaceRequest]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
}

// caData is the CA bundle of cfg, inline or from its file.
func caData(cfg *rest.Config) ([]byte, error) {
	c := rest.CopyConfig(cfg)
	if err := rest.LoadTLSFiles(c); err != nil {
		return nil, fmt.Errorf("space stand-in: reading the CA of its rest.Config: %w", err)
	}
	return c.CAData, nil
}
