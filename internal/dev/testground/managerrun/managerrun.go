// Package managerrun runs a stand-in's controller-runtime manager in the background the way the
// dev stack supervises its components: started once, ready once its caches have synced, telling
// when and why it ended on its own (Done, Err), and stopped and waited for once.
package managerrun

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Run is one manager's run.
type Run struct {
	name string
	mgr  manager.Manager

	mu      sync.Mutex
	cancel  context.CancelFunc // nil before Start and after Stop
	exited  chan struct{}      // closed when the manager has returned
	err     error              // why it returned, once exited is closed
	started bool
}

// New prepares a run of mgr; name says whose manager it is in errors ("CaaS stand-in").
func New(name string, mgr manager.Manager) *Run { return &Run{name: name, mgr: mgr} }

// NewStandIn builds a stand-in's manager on cfg (client-go's types, no metrics or probes) and
// an uncached client on the same scheme, for writes that must not wait for the cache; it
// returns the manager's run and the client. Register controllers on run.Manager().
func NewStandIn(name string, cfg *rest.Config) (*Run, client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, fmt.Errorf("%s client: %w", name, err)
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s manager: %w", name, err)
	}
	return New(name, mgr), c, nil
}

// Start starts the manager and returns once its caches have synced, with the context it runs
// under, which ends at Stop. A manager that fails first is an error, and the run is over.
func (r *Run) Start(ctx context.Context) (context.Context, error) {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return nil, fmt.Errorf("the %s was already started", r.name)
	}
	r.started = true
	ctx, r.cancel = context.WithCancel(ctx)
	r.exited = make(chan struct{})
	exited := r.exited
	r.mu.Unlock()
	go func() {
		err := r.mgr.Start(ctx)
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		close(exited)
	}()
	synced := make(chan bool, 1)
	go func() { synced <- r.mgr.GetCache().WaitForCacheSync(ctx) }()
	select {
	case ok := <-synced:
		if ok {
			return ctx, nil
		}
		return nil, errors.Join(fmt.Errorf("%s: its watches never synced", r.name), r.Stop())
	case <-exited:
		err := r.Err()
		_ = r.Stop() // it has returned: this only ends the run
		return nil, fmt.Errorf("%s: %w", r.name, err)
	}
}

// Manager is the manager the run runs.
func (r *Run) Manager() manager.Manager { return r.mgr }

// Done is closed once the manager has returned: after Stop, or when it failed. It is nil
// before Start.
func (r *Run) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exited
}

// Err says why the manager returned, once Done is closed; nil before.
func (r *Run) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.exited:
		return r.err
	default:
		return nil
	}
}

// Stop stops the manager and waits for it; it returns the manager's error. Later calls, and a
// call before Start, return nil.
func (r *Run) Stop() error {
	r.mu.Lock()
	cancel, exited := r.cancel, r.exited
	r.cancel = nil
	r.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	<-exited
	return r.Err()
}
