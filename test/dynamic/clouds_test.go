package dynamic

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// A platform moved to another cloud (here from the local VM cloud to EC2) keeps reaching the
// VMs it launched before: the busy one is retired, serves its task to the end and is
// terminated through the cloud it runs in; new tasks get VMs of the new cloud; nothing leaks.
func TestConfigChangeReachesOldVMs(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/ppc64le"
	pool := devstack.DynamicSettings{MaxInstances: 2, Concurrency: 2, MaxAgeMinutes: 30}
	useConfig(t, platform, pool)
	a := task(t, ns, "before", platform)
	_, oldVM := vmOf(t, a)
	if oldVM.Spec.Instance.Provider != devstack.ProviderLocalVM {
		t.Fatalf("the first VM came from %s", oldVM.Spec.Instance.Provider)
	}

	pool.Provider = devstack.ProviderAWS
	useConfig(t, platform, pool)
	eventually(t, "the VM launched with the old settings is retired", func() (bool, error) {
		var rec berthv1.BuildHost
		err := c().Get(context.Background(), client.ObjectKeyFromObject(oldVM), &rec)
		return err == nil && strings.Contains(rec.Spec.Instance.Retire, "settings"), err
	})
	b := task(t, ns, "after", platform)
	_, newVM := vmOf(t, b)
	if newVM.Name == oldVM.Name || newVM.Spec.Instance.Provider != devstack.ProviderAWS {
		t.Fatalf("the task after the change runs on %s (%s), want a new VM from aws", newVM.Name, newVM.Spec.Instance.Provider)
	}
	if inst := machineOf(t, oldVM); inst.State != vmcloud.Running {
		t.Fatalf("the old VM went while its task ran: %+v", inst)
	}
	if rec := stacktest.Record(t, c(), a); !handedOver(t, rec) {
		t.Fatalf("the task on the old VM lost it: %s", rec.Status.Phase)
	}

	finish(t, a)
	if _, err := cloud().WaitFor(ctxFor(t), machineOf(t, oldVM).ID, vmcloud.Gone); err != nil {
		t.Fatalf("the old VM was not terminated once its task was cleaned: %v", err)
	}
	finish(t, b)
	settled(t, ns, 1) // the new pool VM stays for the next tasks
	noDoubleLaunch(t)
}

// A cloud credential Secret without one of its keys gives the task an error secret at once,
// saying the credentials were refused and giving a reference, and launches nothing; the
// operator's Event under that reference names the Secret and the key (the tenant's secret
// does not: what is in berth's namespace is berth's business).
func TestMissingCredentialKeyIsNamed(t *testing.T) {
	ns := namespace(t)
	const platform, secretName = "linux/arm64", "aws-half-credentials"
	half := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: devstack.Namespace},
		Data:       map[string][]byte{"access-key-id": []byte(devstack.AWSAccessKeyID)},
	}
	if err := c().Create(context.Background(), half); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c().Delete(context.Background(), half) })
	useConfig(t, platform, devstack.DynamicSettings{Provider: devstack.ProviderAWS, MaxInstances: 2,
		Settings: map[string]string{"aws-secret": secretName}})
	launched := cloud().LaunchCount()
	tr := task(t, ns, "half", platform)
	msg := string(stacktest.SecretOf(t, c(), tr).Data["error"])
	ref := refPattern.FindString(msg)
	if !strings.Contains(msg, "authentication failed") || ref == "" {
		t.Fatalf("want an error secret saying the credentials failed, with a reference; got %q", msg)
	}
	if note := eventNote(t, devstack.Namespace, "LaunchFailed", ref); !strings.Contains(note, secretName) || !strings.Contains(note, "secret-access-key") {
		t.Errorf("the operator's Event under %s does not name Secret %s and key secret-access-key: %s", ref, secretName, note)
	}
	if n := cloud().LaunchCount() - launched; n != 0 {
		t.Fatalf("%d instances launched without credentials", n)
	}
	settled(t, ns, 0)
}

// A VM someone stops in the EC2 console is still billed, with its volumes, and serves no task:
// berth terminates it and says so, the next task gets a new VM, and nothing is left in the
// account.
func TestAVMStoppedInTheConsoleIsTerminatedAndReplaced(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/loong64"
	useConfig(t, platform, devstack.DynamicSettings{MaxInstances: 1, Provider: devstack.ProviderAWS})
	a := task(t, ns, "stopped", platform)
	_, vm := vmOf(t, a)
	id := vm.Status.Instance.ID
	if err := stack.EC2.StopFromConsole(id); err != nil {
		t.Fatal(err)
	}
	if !eventWith(t, "InstanceStopped", id) {
		t.Fatal("no InstanceStopped event names the stopped VM")
	}
	if _, err := cloud().WaitFor(ctxFor(t), machineOf(t, vm).ID, vmcloud.Gone); err != nil {
		t.Fatalf("the stopped VM was not terminated: %v", err)
	}
	finish(t, a)
	b := task(t, ns, "after", platform)
	if _, next := vmOf(t, b); next.Name == vm.Name || next.Status.Instance.ID == id {
		t.Fatalf("the next task got the stopped VM's record %s (%s)", next.Name, next.Status.Instance.ID)
	}
	finish(t, b)
	settled(t, ns, 0)
	for _, inst := range stack.EC2.Instances() {
		if inst.ID == id && inst.State != "terminated" {
			t.Errorf("EC2 shows the stopped VM %s as %s at the end", id, inst.State)
		}
	}
}

// An instance type EC2 has no capacity for does not stall the task: berth launches the
// platform's next fallback type at once, the VM record says which type served, and an Event
// says why the first was skipped.
func TestAnInstanceTypeWithoutCapacityFallsBackToTheNext(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/mips64"
	const fallback = "m7g.large"
	useConfig(t, platform, devstack.DynamicSettings{MaxInstances: 1, Provider: devstack.ProviderAWS,
		Settings: map[string]string{"fallback-instance-types": fallback}})
	stack.EC2.NoCapacityFor(devstack.AWSType)
	t.Cleanup(func() { stack.EC2.NoCapacityFor() })
	tr := task(t, ns, "fallback", platform)
	_, vm := vmOf(t, tr)
	if vm.Spec.Instance.Fallback != 1 || vm.Status.Instance.InstanceType != fallback {
		t.Fatalf("the VM serving the task: fallback %d, type %q; want %s", vm.Spec.Instance.Fallback, vm.Status.Instance.InstanceType, fallback)
	}
	for _, inst := range stack.EC2.Instances() {
		if inst.ID == vm.Status.Instance.ID && inst.InstanceType != fallback {
			t.Errorf("EC2 launched %s as %s", inst.ID, inst.InstanceType)
		}
	}
	if !eventWith(t, "LaunchFallback", devstack.AWSType+" had no capacity") {
		t.Fatal("no LaunchFallback event says why the first type was skipped")
	}
	finish(t, tr)
	settled(t, ns, 0)
}
