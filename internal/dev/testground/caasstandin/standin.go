// Package caasstandin stands in for the cluster-templates-operator (CaaS, "cluster as a
// service") for tests and the dev stack: a ClusterTemplateInstance gets a real throwaway
// cluster — a second kube-apiserver and etcd started by this process — with the Secrets and
// status the real operator writes, and a validating admission webhook enforces
// ClusterTemplateQuotas when an instance is created.
//
// What happens to an instance is chosen by its template's spec.clusterDefinition, so that a
// test or the dev stack picks a fault by the template it names:
//
//   - DefinitionReady, and any definition not listed here: the install Job runs, a control plane
//     boots, the instance goes Pending → ClusterInstalling → Ready.
//   - DefinitionInstallFails: the install Job's Pod fails with an install log (its container
//     terminated with exit code 1 and the log's tail as its message, as `kubectl describe`
//     shows), a Warning Event on the instance, phase ClusterInstallFailed.
//   - DefinitionNeverReady: the install runs for ever; phase ClusterInstalling.
//   - DefinitionCredentials: bring-your-own-cloud; the instance's parameter credentialsSecret
//     names a Secret in its namespace with the keys AccessKeyIDKey and SecretAccessKeyKey.
//     Missing or incomplete: phase CredentialsFailed naming the Secret and key; else it boots.
//
// A booted cluster serves OpenShift's route.openshift.io/v1 Route and has the console's Route,
// Route console in namespace openshift-console with host ConsoleHost(instance name), which the
// real eaas-get-ephemeral-cluster-credentials step reads.
//
// A template that does not exist fails the instance (phase Failed). Deleting an instance stops
// its control plane and deletes its Secrets; Stop stops every control plane the stand-in
// booted. The control planes live in this process: a restarted stand-in boots a new one for
// each instance that is not in a terminal phase.
package caasstandin

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/berth-ci/berth/internal/dev/testground/managerrun"
)

// Cluster definitions (a ClusterTemplate's spec.clusterDefinition) that choose what the
// stand-in does with an instance of the template.
const (
	DefinitionReady        = "standin/ready"
	DefinitionInstallFails = "standin/install-fails"
	DefinitionNeverReady   = "standin/never-ready"
	DefinitionCredentials  = "standin/credentials"
)

// What a DefinitionCredentials instance must bring: a parameter naming a Secret in its
// namespace, and the keys that Secret must hold (non-empty).
const (
	CredentialsParameter = "credentialsSecret"
	AccessKeyIDKey       = "aws_access_key_id"
	SecretAccessKeyKey   = "aws_secret_access_key"
)

// StandIn plays the cluster-templates-operator against one apiserver.
type StandIn struct {
	cfg    *rest.Config
	client client.Client // uncached: every decision is made on what the apiserver holds now
	run    *managerrun.Run
	boots  chan event.GenericEvent // a boot has ended: look at its instance again
	hook   *webhook

	mu       sync.Mutex
	ctx      context.Context // the stand-in's; ends when it stops
	clusters map[types.UID]*cluster
	booting  sync.WaitGroup
	stopping bool
}

// Cluster is a control plane the stand-in runs for an instance.
type Cluster struct {
	Namespace, Name string // the instance's
	APIServerURL    string
}

// New prepares a stand-in acting with cfg, which needs to be a cluster admin (it registers a
// webhook and writes Secrets, Jobs, Pods and Events in the instances' namespaces).
func New(cfg *rest.Config) (*StandIn, error) {
	run, c, err := managerrun.NewStandIn("CaaS stand-in", cfg)
	if err != nil {
		return nil, err
	}
	s := &StandIn{
		cfg:      cfg,
		client:   c,
		run:      run,
		boots:    make(chan event.GenericEvent, 16),
		clusters: map[types.UID]*cluster{},
	}
	err = ctrl.NewControllerManagedBy(run.Manager()).
		Named("clustertemplateinstance-standin").
		For(newObject(instanceGVK)).
		WatchesRawSource(source.Channel(s.boots, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)}).
		Complete(reconcile.Func(s.reconcile))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Start runs the stand-in in the background until ctx ends or Stop is called. It returns once
// it watches and its quota webhook is in force, so that an instance created after it is served
// and checked.
func (s *StandIn) Start(ctx context.Context) error {
	if err := s.grantAdmins(ctx); err != nil {
		return err
	}
	ctx, err := s.run.Start(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	hook, err := startWebhook(ctx, s.client, s.run.Manager().GetAPIReader())
	if err != nil {
		return errors.Join(err, s.Stop())
	}
	s.mu.Lock()
	s.hook = hook
	s.mu.Unlock()
	return nil
}

// Done is closed once the stand-in's manager has returned: after Stop, or when it failed. It is
// nil before Start.
func (s *StandIn) Done() <-chan struct{} { return s.run.Done() }

// Err says why the manager returned, once Done is closed.
func (s *StandIn) Err() error { return s.run.Err() }

// Stop stops the stand-in: its webhook (unregistered, so that creating an instance is not
// refused for want of it), its controller and every control plane it booted. Instances and
// their Secrets stay; a new stand-in carries on with them.
func (s *StandIn) Stop() error {
	s.mu.Lock()
	hook, already := s.hook, s.stopping
	s.stopping = true
	s.mu.Unlock()
	if already {
		return nil
	}
	var errs []error
	if hook != nil {
		errs = append(errs, hook.stop(s.client))
	}
	errs = append(errs, s.run.Stop())
	s.booting.Wait() // a boot under way ends in a control plane that must be stopped too
	s.mu.Lock()
	clusters := s.clusters
	s.clusters = map[types.UID]*cluster{}
	s.mu.Unlock()
	for _, c := range clusters {
		errs = append(errs, c.stop())
	}
	return errors.Join(errs...)
}

// Clusters lists the control planes running for instances (not those still booting).
func (s *StandIn) Clusters() []Cluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Cluster
	for _, c := range s.clusters {
		if c.running() {
			out = append(out, Cluster{Namespace: c.instance.Namespace, Name: c.instance.Name, APIServerURL: c.url})
		}
	}
	return out
}
