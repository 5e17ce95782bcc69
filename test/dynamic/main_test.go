// Package dynamic shows berth's dynamic and dynamic-pool platforms end to end: a real control
// plane, berth's controller, and the local VM cloud whose VMs are real sshd hosts booted on
// demand. Faults are injected at the cloud.
package dynamic

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/hosts"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

var stack *devstack.Stack

// clock is the controller's VM clock: tests move it to pass max-age without waiting.
var clock = &testClock{}

type testClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

func TestMain(m *testing.M) {
	o := stacktest.Options()
	o.VMPlanInterval, o.SweepInterval, o.LeakGrace = 200*time.Millisecond, 300*time.Millisecond, 2*time.Second
	o.Clock = clock.Now
	os.Exit(stacktest.MainWith(m, &stack, 1, o, func(d *devstack.Options) { d.VMCloud = true }))
}

func c() client.Client { return stack.ControlPlane.Client }

func cloud() *vmcloud.Cloud { return stack.VMCloud }

// useConfig puts one local-vm platform into force (and the stack's static host, which the
// dynamic tests do not use) and waits until the controller has applied it.
func useConfig(t *testing.T, platform string, d devstack.DynamicSettings) {
	t.Helper()
	data := stack.StaticHostConfig("linux/s390x", 1)
	stack.AddDynamicPlatform(data, platform, d)
	stacktest.ApplyConfig(t, stack, data)
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.Eventually(t, what, cond)
}

func namespace(t *testing.T) string { return stacktest.Namespace(t, stack) }

func task(t *testing.T, ns, name, platform string) *pipelinev1.TaskRun {
	t.Helper()
	optional := false
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah",
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name, Optional: &optional}}}},
			},
		},
	}
	if err := c().Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

func finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil); err != nil {
		t.Fatal(err)
	}
}

// vmOf waits for the task's secret and returns the VM record its allocation names.
func vmOf(t *testing.T, tr *pipelinev1.TaskRun) (*corev1.Secret, *berthv1.BuildHost) {
	t.Helper()
	secret := stacktest.SecretOf(t, c(), tr)
	if msg, failed := secret.Data["error"]; failed {
		t.Fatalf("%s got an error secret: %s", tr.Name, msg)
	}
	rec := stacktest.Ready(t, c(), tr)
	var vm berthv1.BuildHost
	if err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: rec.Status.Login.Host}, &vm); err != nil {
		t.Fatalf("the VM record %s of %s: %v", rec.Status.Login.Host, tr.Name, err)
	}
	if vm.Spec.Instance == nil || vm.Status.Instance == nil || vm.Status.Instance.ID == "" {
		t.Fatalf("%s holds %s, which is not a launched VM", tr.Name, vm.Name)
	}
	return secret, &vm
}

// launchesThrough counts the instances launched through one provider's API: the EC2
// stand-in's for aws, the local VM cloud's own for local-vm (its machines less EC2's). A VM
// the other provider launched around a config change is not counted.
func launchesThrough(provider string) int {
	viaEC2 := map[string]bool{}
	for _, inst := range stack.EC2.Instances() {
		viaEC2[inst.MachineID] = true
	}
	if provider == devstack.ProviderAWS {
		return len(viaEC2)
	}
	return cloud().LaunchCount() - len(viaEC2)
}

// machineOf finds the machine of a VM record in the cloud by its launch token, which every
// provider passes on, whatever id its API gives the instance.
func machineOf(t *testing.T, vm *berthv1.BuildHost) vmcloud.Instance {
	t.Helper()
	token := hosts.Token(vm)
	for _, inst := range cloud().Instances() {
		if inst.Token == token {
			return inst
		}
	}
	t.Fatalf("no machine in the cloud was launched with %s's token %s", vm.Name, token)
	return vmcloud.Instance{}
}

// settled waits until no record of the namespace is left and every instance berth launched
// is gone or accounted for by a VM record, then checks that no instance is alive without one.
func settled(t *testing.T, ns string, wantAlive int) {
	t.Helper()
	eventually(t, "everything of "+ns+" is cleaned up and only accounted VMs run", func() (bool, error) {
		var records berthv1.AllocationList
		if err := c().List(context.Background(), &records, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, rec := range records.Items {
			if rec.Spec.TaskRun.Namespace == ns {
				return false, fmt.Errorf("record of %s left: %s %q", rec.Spec.TaskRun.Key(), rec.Status.Phase, rec.Status.Message)
			}
		}
		alive, unaccounted, err := aliveInstances()
		if err != nil {
			return false, err
		}
		if len(unaccounted) > 0 {
			return false, fmt.Errorf("instances without a record: %v", unaccounted)
		}
		if alive != wantAlive {
			return false, fmt.Errorf("%d instances alive, want %d", alive, wantAlive)
		}
		return true, nil
	})
}

// aliveInstances counts the cloud's pending and running instances, and lists those no VM
// record accounts for (leaks).
func aliveInstances() (int, []string, error) {
	var list berthv1.BuildHostList
	if err := c().List(context.Background(), &list, client.InNamespace(devstack.Namespace), client.HasLabels{hosts.LabelVM}); err != nil {
		return 0, nil, err
	}
	recorded := map[string]bool{}
	for _, r := range list.Items {
		if r.Status.Instance != nil && r.Status.Instance.ID != "" {
			recorded[r.Status.Instance.ID] = true
		}
		recorded[hosts.Token(&r)] = true
	}
	alive := 0
	var unaccounted []string
	for _, inst := range cloud().Instances() {
		if inst.State == vmcloud.Gone {
			continue
		}
		alive++
		if !recorded[inst.ID] && !recorded[inst.Token] {
			unaccounted = append(unaccounted, inst.ID)
		}
	}
	return alive, unaccounted, nil
}

// noDoubleLaunch: no token was ever launched twice.
func noDoubleLaunch(t *testing.T) {
	t.Helper()
	seen := map[string]string{}
	for _, inst := range cloud().Instances() {
		if other, dup := seen[inst.Token]; dup {
			t.Errorf("token %s launched twice: %s and %s", inst.Token, other, inst.ID)
		}
		seen[inst.Token] = inst.ID
	}
}

func vmRecords(platform string) ([]berthv1.BuildHost, error) {
	var list berthv1.BuildHostList
	err := c().List(context.Background(), &list, client.InNamespace(devstack.Namespace), client.HasLabels{hosts.LabelVM})
	var out []berthv1.BuildHost
	for _, r := range list.Items {
		if r.Spec.Instance.Platform == platform {
			out = append(out, r)
		}
	}
	return out, err
}

// eventWith tells whether an Event of berth's namespace has reason and mentions text.
func eventWith(t *testing.T, reason, text string) bool {
	t.Helper()
	found := false
	eventually(t, "an Event "+reason+" mentioning "+text, func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(context.Background(), &events, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && strings.Contains(e.Note, text) {
				found = true
			}
		}
		return found, nil
	})
	return found
}

// handedOver tells whether the record's task has its build user (see stacktest.HandedOver).
func handedOver(t *testing.T, rec *berthv1.Allocation) bool {
	t.Helper()
	ok, err := stacktest.HandedOver(context.Background(), c(), rec)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}
