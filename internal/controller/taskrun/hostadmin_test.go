//go:build stack

package taskrun_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/dev/devstack"
)

// berthHost runs `berth host <args>` as an operator would, against the test cluster.
func berthHost(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := cli.NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(append([]string{"host"}, args...), "--namespace", devstack.Namespace, "--kubeconfig", stack.KubeConfigPath))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func mustBerthHost(t *testing.T, args ...string) string {
	t.Helper()
	out, err := berthHost(t, args...)
	if err != nil {
		t.Fatalf("berth host %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func buildHostRecord(t *testing.T, host string) *berthv1.BuildHost {
	t.Helper()
	var bh berthv1.BuildHost
	if err := c().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: berthv1.BuildHostName(host)}, &bh); err != nil {
		t.Fatal(err)
	}
	return &bh
}

// hostCondition is what `kubectl get bhost` shows of host's record: its condition typ, and
// whether the status was computed from the record's current spec.
func hostCondition(t *testing.T, host, typ string) (c metav1.Condition, current bool) {
	t.Helper()
	bh := buildHostRecord(t, host)
	found := meta.FindStatusCondition(bh.Status.Conditions, typ)
	if found == nil {
		return metav1.Condition{}, false
	}
	return *found, bh.Status.ObservedGeneration == bh.Generation && found.ObservedGeneration == bh.Generation
}

// TestOperatorsDrainUndrainAndForgetHostsWithBerthHost drives a host's life through the operator's commands: a drained
// host takes no task, an undrained one does again, and a forgotten dead host stops owing its
// cleanups, frees its slot and stays drained.
func TestOperatorsDrainUndrainAndForgetHostsWithBerthHost(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	hosts := hostsByName()
	one, two, three := hosts[0], hosts[1], hosts[2]
	mustBerthHost(t, "drain", one.Name)
	mustBerthHost(t, "drain", two.Name)
	defer func() {
		for _, h := range hosts {
			if _, err := berthHost(t, "undrain", h.Name); err != nil {
				t.Errorf("undraining %s: %v", h.Name, err)
			}
		}
	}()

	first := create(t, userTaskRun(ns, "on-the-open-host", platform, ""))
	ready(t, first)
	if got := recordOf(t, first).Status.Login.Host; got != three.Name {
		t.Fatalf("the task went to %s; only %s is not drained", got, three.Name)
	}
	second := create(t, userTaskRun(ns, "waits-for-undrain", platform, ""))
	waiting(t, second)

	out := mustBerthHost(t, "undrain", one.Name)
	if !strings.Contains(out, "takes tasks again") {
		t.Errorf("undrain said %q", out)
	}
	ready(t, second)
	if got := recordOf(t, second).Status.Login.Host; got != one.Name {
		t.Fatalf("the waiter went to %s; only %s was undrained", got, one.Name)
	}

	// The host dies with the task's build user on it; its clean is owed and holds the slot.
	user := recordOf(t, second).Status.BuildUser
	cut(t, one)
	finish(t, second)
	eventually(t, "the clean of "+user+" is owed", func() (bool, error) {
		rec := recordOf(t, second)
		return rec.Status.Phase == berthv1.PhaseCleaning && rec.Status.CleanFailures > 0, nil
	})

	if _, err := berthHost(t, "forget", one.Name); err == nil {
		t.Fatal("forget without --yes went ahead")
	}
	out = mustBerthHost(t, "forget", one.Name, "--yes")
	if !strings.Contains(out, "WARNING: 1 build user") || !strings.Contains(out, user) {
		t.Errorf("forget did not warn about the build user it drops: %q", out)
	}
	eventually(t, "the forgotten debt is dropped and the host drained", func() (bool, error) {
		bh := buildHostRecord(t, one.Name)
		ok, err := controllerEvent("DebtForgotten", "build user "+user+" of "+ns+"/"+second.Name)
		return ok && bh.Spec.Drained && !bh.Spec.Forget && bh.Status.PendingCleans == 0, err
	})
	eventually(t, "the record of "+one.Name+" shows it drained, not ready", func() (bool, error) {
		draining, current := hostCondition(t, one.Name, berthv1.HostDraining)
		ready, _ := hostCondition(t, one.Name, berthv1.HostReady)
		return current && draining.Status == metav1.ConditionTrue && ready.Status == metav1.ConditionFalse && ready.Reason == "Drained", nil
	})
	finish(t, first)
	settled(t, ns)

	// berth no longer owes the host anything: the user it forgot is still there when the
	// host comes back, for the operator to remove as the warning said.
	restore(t, one)
	if !userExists(t, one, user) {
		t.Fatalf("%s is gone from the forgotten host: berth touched it after forgetting it", user)
	}
	if _, err := one.Run(context.Background(), "pkill -KILL -u "+user+"; userdel --remove "+user); err != nil {
		t.Fatal(err)
	}
	noBuildUsersLeft(t)
}
