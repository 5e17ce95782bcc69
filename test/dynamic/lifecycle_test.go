package dynamic

import (
	"context"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	berthcloud "github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/localvm"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
	corev1 "k8s.io/api/core/v1"
)

// max-age culls a pooled VM that is idle past it, and never one a task still runs on.
func TestMaxAgeCullsIdleNeverBusy(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/riscv64"
	useConfig(t, platform, devstack.DynamicSettings{MaxInstances: 2, Concurrency: 1, MaxAgeMinutes: 5})
	a, b := task(t, ns, "a", platform), task(t, ns, "b", platform)
	_, vmA := vmOf(t, a)
	_, vmB := vmOf(t, b)
	finish(t, a) // vmA idle, vmB busy
	clock.Advance(10 * time.Minute)
	t.Cleanup(func() { clock.Advance(-10 * time.Minute) })
	if _, err := cloud().WaitFor(ctxFor(t), vmA.Status.Instance.ID, vmcloud.Gone); err != nil {
		t.Fatalf("the idle VM past max-age was not culled: %v", err)
	}
	if inst, _ := cloud().Instance(vmB.Status.Instance.ID); inst.State != vmcloud.Running {
		t.Fatalf("the busy VM past max-age was terminated under its task: %+v", inst)
	}
	if rec := stacktest.Record(t, c(), b); !handedOver(t, rec) {
		t.Fatalf("b lost its VM: %s", rec.Status.Phase)
	}
	finish(t, b)
	if _, err := cloud().WaitFor(ctxFor(t), vmB.Status.Instance.ID, vmcloud.Gone); err != nil {
		t.Fatalf("the retired VM was not culled once idle: %v", err)
	}
	settled(t, ns, 0)
}

// min-idle keeps a warm VM, so a task's secret appears without waiting for a boot; the warm
// VM taken is replaced.
func TestMinIdleServesWithoutBoot(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/mips64le"
	useConfig(t, platform, devstack.DynamicSettings{MaxInstances: 3, MinIdle: 1})
	var warm berthv1.BuildHost
	eventually(t, "a warm VM is ready", func() (bool, error) {
		list, err := vmRecords(platform)
		for _, r := range list {
			if r.Status.Instance != nil && r.Status.Instance.Phase == berthv1.InstanceReady {
				warm = r
				return true, nil
			}
		}
		return false, err
	})
	cloud().SetBootDelay(time.Hour) // from now on a boot would never finish in this test
	t.Cleanup(func() { cloud().SetBootDelay(0) })
	tr := task(t, ns, "warm", platform)
	_, vm := vmOf(t, tr)
	if vm.Name != warm.Name {
		t.Fatalf("the task got %s, not the warm VM %s", vm.Name, warm.Name)
	}
	eventually(t, "the warm VM taken is replaced by a launch", func() (bool, error) {
		list, err := vmRecords(platform)
		return len(list) == 2, err
	})
	finish(t, tr)
	cloud().SetBootDelay(0)
	useConfig(t, "linux/arm64", devstack.DynamicSettings{MaxInstances: 1}) // the platform goes: so do its VMs
	settled(t, ns, 0)
}

// Faults of the cloud end in the right outcome: capacity and failed boots are retried, a
// refused credential fails the waiting task at once, a VM lost while booting is replaced under
// a new token, and nothing leaks.
func TestCloudFaults(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/arm64"
	useConfig(t, platform, devstack.DynamicSettings{MaxInstances: 2})

	t.Run("capacity then boot failure are retried", func(t *testing.T) {
		cloud().FailLaunches(2)
		cloud().FailBoots(1)
		tr := task(t, ns, "capacity", platform)
		vmOf(t, tr)
		if !eventWith(t, "LaunchRetry", "insufficient capacity") {
			t.Fatal("no LaunchRetry event tells of the capacity error")
		}
		finish(t, tr)
	})
	t.Run("throttling is honoured", func(t *testing.T) {
		cloud().Throttle(2, 100*time.Millisecond)
		tr := task(t, ns, "throttled", platform)
		vmOf(t, tr)
		finish(t, tr)
	})
	t.Run("lost while booting is relaunched under a new token", func(t *testing.T) {
		cloud().SetBootDelay(3 * time.Second)
		tr := task(t, ns, "lost", platform)
		var first vmcloud.Instance
		eventually(t, "a VM is launched for the task", func() (bool, error) {
			for _, i := range cloud().Instances() {
				if i.State == vmcloud.Pending {
					first = i
					return true, nil
				}
			}
			return false, nil
		})
		cloud().SetBootDelay(0)
		if err := cloud().Vanish(first.ID); err != nil {
			t.Fatal(err)
		}
		_, vm := vmOf(t, tr)
		if vm.Status.Instance.ID == first.ID || vm.Spec.Instance.Attempt < 2 {
			t.Fatalf("the lost VM was not replaced under a new token: %s attempt %d", vm.Status.Instance.ID, vm.Spec.Instance.Attempt)
		}
		finish(t, tr)
	})
	t.Run("refused credentials fail the task at once", func(t *testing.T) {
		var s corev1.Secret
		key := client.ObjectKey{Namespace: devstack.Namespace, Name: devstack.VMCloudSecret}
		if err := c().Get(context.Background(), key, &s); err != nil {
			t.Fatal(err)
		}
		good := s.Data["api-key"]
		s.Data["api-key"] = []byte("wrong")
		if err := c().Update(context.Background(), &s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c().Get(context.Background(), key, &s)
			s.Data["api-key"] = good
			_ = c().Update(context.Background(), &s)
		})
		tr := task(t, ns, "refused", platform)
		secret := stacktest.SecretOf(t, c(), tr)
		if msg := string(secret.Data["error"]); !strings.Contains(msg, "authentication failed") {
			t.Fatalf("want an error secret naming the refused credentials, got %q", msg)
		}
	})
	settled(t, ns, 0)
	noDoubleLaunch(t)
}

// The sweeper terminates an instance carrying this installation's tag that no record accounts
// for, running or stopped, and leaves alone one without the tag.
func TestSweeperTerminatesUntrackedInstances(t *testing.T) {
	const platform = "linux/arm64"
	useConfig(t, platform, devstack.DynamicSettings{MaxInstances: 1})
	var cm corev1.ConfigMap
	eventually(t, "berth has an installation id", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: hosts.InstallationConfigMap}, &cm)
		return err == nil, client.IgnoreNotFound(err)
	})
	provider, err := localvm.New(berthcloud.Settings{Platform: platform, Values: map[string]string{"endpoint": cloud().URL(), "secret": devstack.VMCloudSecret},
		Secret: func(ctx context.Context, name string) (map[string][]byte, error) {
			var s corev1.Secret
			err := c().Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: name}, &s)
			return s.Data, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	ours, err := provider.Launch(context.Background(), berthcloud.LaunchRequest{Token: "planted-1", Name: "planted",
		Tags: map[string]string{berthcloud.TagInstallation: cm.Data["id"], berthcloud.TagPlatform: "linux-arm64"}})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := provider.Launch(context.Background(), berthcloud.LaunchRequest{Token: "foreign-1", Name: "foreign",
		Tags: map[string]string{berthcloud.TagInstallation: "another-cluster", berthcloud.TagPlatform: "linux-arm64"}})
	if err != nil {
		t.Fatal(err)
	}
	// A stopped one is still billed, with its volumes: the sweeper lists and ends it too.
	stopped, err := provider.Launch(context.Background(), berthcloud.LaunchRequest{Token: "planted-2", Name: "planted-stopped",
		Tags: map[string]string{berthcloud.TagInstallation: cm.Data["id"], berthcloud.TagPlatform: "linux-arm64"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cloud().Stop(stopped.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{ours.ID, stopped.ID} {
		if _, err := cloud().WaitFor(ctxFor(t), id, vmcloud.Gone); err != nil {
			t.Fatalf("the planted instance %s with berth's tag was not swept: %v", id, err)
		}
		if !eventWith(t, "LeakTerminated", id) {
			t.Fatalf("no LeakTerminated event names the swept instance %s", id)
		}
	}
	if inst, _ := cloud().Instance(foreign.ID); inst.State == vmcloud.Gone {
		t.Fatal("the sweeper terminated an instance of another installation")
	}
	if err := provider.Terminate(context.Background(), foreign.ID); err != nil {
		t.Fatal(err)
	}
}
