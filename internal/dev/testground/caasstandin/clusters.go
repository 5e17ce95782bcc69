package caasstandin

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// cluster is the control plane of one instance: booting, running, or failed to boot. The
// controlplane package records its processes in its ledger, so that even a stand-in killed
// outright leaves none behind once the next control plane starts.
type cluster struct {
	instance  types.NamespacedName
	booted    bool
	cp        *controlplane.ControlPlane // once booted, unless err
	url       string                     // its apiserver's, as its kubeconfig names it
	err       error                      // why it did not boot
	abandoned bool                       // the instance went while it booted: stop it once booted
}

func (c *cluster) running() bool { return c.booted && c.cp != nil }

func (c *cluster) stop() error {
	if c.cp == nil {
		return nil
	}
	if err := c.cp.Stop(); err != nil {
		return fmt.Errorf("stopping the control plane of instance %s: %w", c.instance, err)
	}
	return nil
}

var log = ctrl.Log.WithName("caas-standin")

// bootOptions make a throwaway cluster as a tenant would get it: no CRDs of berth's or Tekton's,
// but OpenShift's Route (see console.go). It runs no kube-controller-manager (one process fewer
// per cluster on a small machine), so on it owner references are not followed and a deleted
// namespace stays Terminating; a cluster that lives as long as one integration test has not
// needed either. New options each boot, as the CRD object is written into as it is installed.
func bootOptions() []controlplane.Option {
	return []controlplane.Option{controlplane.WithoutDefaultCRDs(), controlplane.WithoutGarbageCollector(), controlplane.WithCRDObjects(routeCRD())}
}

// bootCluster starts the control plane of an instance and gives it what an installed
// OpenShift cluster has that clients read: the console's Route. It returns the apiserver's URL
// as its kubeconfig names it.
func bootCluster(instanceName string) (*controlplane.ControlPlane, string, error) {
	cp, err := controlplane.Start(bootOptions()...)
	if err != nil {
		return nil, "", err
	}
	url, err := serverOf(cp.KubeConfig)
	if err == nil {
		err = installConsole(cp.Client, instanceName)
	}
	if err != nil {
		return nil, "", errors.Join(err, cp.Stop())
	}
	return cp, url, nil
}

// clusterOf returns (a copy of) the instance's control plane, booting one in the background if it
// has none. A boot takes seconds; its end brings the instance back to reconcile.
func (s *StandIn) clusterOf(uid types.UID, key types.NamespacedName) cluster {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clusters[uid]; ok {
		return *c
	}
	c := &cluster{instance: key}
	if s.stopping {
		return *c // left installing, for the next stand-in to boot
	}
	s.clusters[uid] = c
	s.booting.Add(1)
	go func() {
		defer s.booting.Done()
		cp, url, err := bootCluster(key.Name)
		s.mu.Lock()
		c.booted, c.cp, c.url, c.err = true, cp, url, err
		abandoned, stopping := c.abandoned, s.stopping
		if abandoned {
			delete(s.clusters, uid)
		}
		s.mu.Unlock()
		if abandoned {
			if err := c.stop(); err != nil {
				log.Error(err, "the instance went while its cluster booted")
			}
		}
		if !stopping { // Stop stops what is left in s.clusters
			s.requeue(key)
		}
	}()
	return *c
}

// forget removes the instance's control plane from the stand-in and stops it. One still booting
// is marked to be stopped once booted; forget reports false then, and the boot's end brings
// the instance back.
func (s *StandIn) forget(uid types.UID) (bool, error) {
	s.mu.Lock()
	c, ok := s.clusters[uid]
	if ok && !c.booted {
		c.abandoned = true
		s.mu.Unlock()
		return false, nil
	}
	delete(s.clusters, uid)
	s.mu.Unlock()
	if !ok {
		return true, nil
	}
	return true, c.stop()
}

// forgetByName stops the control planes of an instance that is gone without its finalizer
// having run (removed by hand).
func (s *StandIn) forgetByName(key types.NamespacedName) error {
	s.mu.Lock()
	var uids []types.UID
	for uid, c := range s.clusters {
		if c.instance == key {
			uids = append(uids, uid)
		}
	}
	s.mu.Unlock()
	for _, uid := range uids {
		if _, err := s.forget(uid); err != nil {
			return err
		}
	}
	return nil
}

// serverOf is the apiserver URL of a kubeconfig's current context.
func serverOf(kubeconfig []byte) (string, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return "", fmt.Errorf("reading a booted cluster's kubeconfig: %w", err)
	}
	if ctx, ok := cfg.Contexts[cfg.CurrentContext]; ok {
		if cluster, ok := cfg.Clusters[ctx.Cluster]; ok {
			return cluster.Server, nil
		}
	}
	return "", errors.New("a booted cluster's kubeconfig names no server for its current context")
}

// requeue brings an instance back to reconcile.
func (s *StandIn) requeue(key types.NamespacedName) {
	obj := newObject(instanceGVK)
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	select {
	case s.boots <- event.GenericEvent{Object: obj}:
	case <-s.stopped():
	}
}

// stopped is closed once the stand-in stops.
func (s *StandIn) stopped() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx.Done()
}
