package dynamic

import (
	"context"
	"fmt"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	berthcloud "github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// providers are the clouds the scenarios run on: berth's local VM cloud, and the EC2
// stand-in reached through the AWS SDK (controller → SDK → EC2 Query API), both over the
// same machines.
var providers = []string{devstack.ProviderLocalVM, devstack.ProviderAWS}

// A task on a dynamic platform gets a VM of its own, with its build user on it, and the VM is
// terminated once the task has ended.
func TestDynamicTaskGetsFreshVMTerminatedAfter(t *testing.T) {
	for _, provider := range providers {
		t.Run(provider, func(t *testing.T) { dynamicTaskGetsFreshVM(t, provider) })
	}
}

func dynamicTaskGetsFreshVM(t *testing.T, provider string) {
	ns := namespace(t)
	const platform = "linux/arm64"
	useConfig(t, platform, devstack.DynamicSettings{Provider: provider, MaxInstances: 2})
	launched := launchesThrough(provider)
	tr := task(t, ns, "build", platform)
	secret, vm := vmOf(t, tr)
	inst := machineOf(t, vm)
	if inst.State != vmcloud.Running {
		t.Fatalf("the task's VM %s is not running in the cloud: %+v", vm.Status.Instance.ID, inst)
	}
	if host := string(secret.Data["host"]); !strings.HasSuffix(host, "@"+inst.Address) {
		t.Fatalf("the secret sends the task to %s, the VM is at %s", host, inst.Address)
	}
	if want := strings.TrimSpace(vm.Status.Instance.HostKey); want == "" || !strings.HasPrefix(want, inst.HostKey.Type()) {
		t.Fatalf("the VM's host key was not pinned at first contact: %q", want)
	}
	// The build user exists on the VM and nowhere else.
	out, err := cloud().Host(inst.ID).Run(context.Background(), "getent passwd | cut -d: -f1 | grep '^u-' || true")
	if err != nil || !strings.Contains(out, stacktest.Record(t, c(), tr).Status.BuildUser) {
		t.Fatalf("the build user is not on the VM (err %v): %q", err, out)
	}
	if n := launchesThrough(provider) - launched; n != 1 {
		t.Fatalf("%d VMs launched for one task, want 1", n)
	}
	finish(t, tr)
	if _, err := cloud().WaitFor(ctxFor(t), inst.ID, vmcloud.Gone); err != nil {
		t.Fatalf("the VM was not terminated after its task: %v", err)
	}
	settled(t, ns, 0)
	noDoubleLaunch(t)
}

// A pool serves three times as many tasks as it may have VMs, never running more than
// max-instances, and packs tasks onto running VMs before launching.
func TestPoolServesManyTasksWithFewVMs(t *testing.T) {
	for _, provider := range providers {
		t.Run(provider, func(t *testing.T) { poolServesManyTasks(t, provider) })
	}
}

func poolServesManyTasks(t *testing.T, provider string) {
	ns := namespace(t)
	// A platform per provider, so that the VMs one run leaves in its pool are not counted
	// in the next one's.
	platform := map[string]string{devstack.ProviderLocalVM: "linux/ppc64le", devstack.ProviderAWS: "linux/riscv64"}[provider]
	const maxInstances, concurrency = 2, 2
	useConfig(t, platform, devstack.DynamicSettings{Provider: provider, MaxInstances: maxInstances, Concurrency: concurrency, MaxAgeMinutes: 30})
	peak := watchPeak(t, platform)
	tasks := 3 * maxInstances * concurrency
	served := map[string]string{}
	var running []*pipelineTask
	for i := range tasks {
		running = append(running, &pipelineTask{tr: task(t, ns, fmt.Sprintf("pool-%d", i), platform)})
	}
	// Serve in waves: each task that gets its secret is finished, which frees its slot.
	for len(served) < tasks {
		progressed := false
		for _, p := range running {
			if p.done {
				continue
			}
			var rec berthv1.Allocation
			err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(p.tr.UID)}, &rec)
			if err != nil || !handedOver(t, &rec) {
				continue
			}
			served[p.tr.Name] = rec.Status.Login.Host
			finish(t, p.tr)
			p.done, progressed = true, true
		}
		if !progressed {
			eventually(t, "another pool task is served", func() (bool, error) {
				for _, p := range running {
					if p.done {
						continue
					}
					var rec berthv1.Allocation
					err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(p.tr.UID)}, &rec)
					if err == nil && handedOver(t, &rec) {
						return true, nil
					}
				}
				return false, nil
			})
		}
	}
	vmsUsed := map[string]bool{}
	for _, host := range served {
		vmsUsed[host] = true
	}
	if len(vmsUsed) > maxInstances {
		t.Fatalf("%d tasks ran on %d VMs, more than max-instances %d", tasks, len(vmsUsed), maxInstances)
	}
	if p := peak(); p > maxInstances {
		t.Fatalf("%d instances ran at once, more than max-instances %d", p, maxInstances)
	}
	// Pooled VMs stay for the next tasks until max-age: none is a leak.
	settled(t, ns, len(vmsUsed))
	noDoubleLaunch(t)
}

type pipelineTask struct {
	tr   *pipelinev1.TaskRun
	done bool
}

// watchPeak samples how many instances of the platform are alive at each change of the
// cloud, until the test ends, and returns a function reading the peak.
func watchPeak(t *testing.T, platform string) func() int {
	label := config.Platform(platform).Label()
	ctx, cancel := context.WithCancel(context.Background())
	peak := make(chan int, 1)
	peak <- 0
	go func() {
		_ = cloud().Wait(ctx, func(all []vmcloud.Instance) (bool, error) {
			alive := 0
			for _, i := range all {
				if i.State != vmcloud.Gone && i.Tags[berthcloud.TagPlatform] == label {
					alive++
				}
			}
			p := <-peak
			peak <- max(p, alive)
			return false, nil
		})
	}()
	t.Cleanup(cancel)
	return func() int { p := <-peak; peak <- p; return p }
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), stacktest.Patience)
	t.Cleanup(cancel)
	return ctx
}
