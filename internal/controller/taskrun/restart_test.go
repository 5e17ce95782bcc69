//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/hostops"
)

// recordOf reads the Allocation of a TaskRun.
func recordOf(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Record(t, c(), tr)
}

func phaseIs(t *testing.T, tr *pipelinev1.TaskRun, phase berthv1.Phase) {
	t.Helper()
	stacktest.PhaseIs(t, c(), tr, phase)
}

// waiting waits until the task waits for a slot (see stacktest.IsWaiting).
func waiting(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	stacktest.Waiting(t, c(), tr)
}

// ready waits until the task has its build user (see stacktest.HandedOver).
func ready(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Ready(t, c(), tr)
}

// hostOf finds the test host a record's login names.
func hostOf(t *testing.T, login *berthv1.HostLogin) *sshhosts.Host {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		if h.Name == login.Host {
			return h
		}
	}
	t.Fatalf("no test host %s", login.Host)
	return nil
}

func userExists(t *testing.T, h *sshhosts.Host, user string) bool {
	t.Helper()
	out, err := h.Run(context.Background(), "id -u "+user+" >/dev/null 2>&1 && echo yes || echo no")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out) == "yes"
}

// readyTask runs one task on hosts of concurrency 2 until its record is ready.
func readyTask(t *testing.T, name string) (string, *pipelinev1.TaskRun) {
	t.Helper()
	applyConfig(t, 2, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, name, platform, ""))
	secretOf(t, tr)
	ready(t, tr)
	return ns, tr
}

// whileStopped stops the controller, does what a crash at that point would have left, and
// starts a new controller.
func whileStopped(t *testing.T, crashLeft func()) {
	t.Helper()
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	crashLeft()
	if err := startController(controllerOptions()); err != nil {
		t.Fatal(err)
	}
}

// Each test stops the controller with a record in one phase, changes what a crash at that
// point would have left, and starts a new controller: it must end with the host clean and the
// slot free.

func TestAWaiterIsServedByTheRestartedController(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	var trs []*pipelinev1.TaskRun
	for i := range stackHosts + 1 {
		trs = append(trs, create(t, userTaskRun(ns, fmt.Sprintf("w-%d", i), platform, "")))
	}
	served, waiting := servedAndWaiting(t, trs, stackHosts)
	last := waiting[0]
	restartController(t, controllerOptions())
	finish(t, served[0])
	if s := secretOf(t, last); len(s.Data["id_rsa"]) == 0 {
		t.Fatalf("the waiter got no host after the restart: %v", s.Data["error"])
	}
	for _, tr := range append(served[1:], last) {
		finish(t, tr)
	}
	settled(t, ns)
	noBuildUsersLeft(t)
}

// TestRestartKeepsTheLineInOrder: tasks wait without records, so a restart finds its queue
// again from the TaskRuns, by creation time, before its first decision. A slot freed while
// berth was down goes to the oldest waiter, though a younger one comes first by name (the
// order in which a fresh cache lists TaskRuns).
func TestRestartKeepsTheLineInOrder(t *testing.T) {
	applyConfig(t, 1, nil)
	ns := namespace(t)
	var holders []*pipelinev1.TaskRun
	for i := range stackHosts {
		holders = append(holders, create(t, userTaskRun(ns, fmt.Sprintf("a-holds-%d", i), platform, "")))
	}
	servedAndWaiting(t, holders, stackHosts)
	older := create(t, userTaskRun(ns, "z-older", platform, ""))
	waiting(t, older)
	// Creation times are whole seconds: the younger one is created in a later one.
	eventually(t, "a second has begun since z-older was created", func() (bool, error) {
		return time.Now().Truncate(time.Second).After(get(t, older).CreationTimestamp.Time), nil
	})
	younger := create(t, userTaskRun(ns, "b-younger", platform, ""))
	waiting(t, younger)
	whileStopped(t, func() {
		// What the next controller finds before its first decision: both, oldest first.
		cfg, err := hostconfig.Read(context.Background(), c(), devstack.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		line, err := taskrun.RestoredLine(context.Background(), c(), devstack.Namespace, cfg, platform)
		if err != nil {
			t.Fatal(err)
		}
		var mine []string
		for _, task := range line {
			if task.Namespace == ns {
				mine = append(mine, task.Name)
			}
		}
		if !slices.Equal(mine, []string{"z-older", "b-younger"}) {
			t.Fatalf("the line a restart finds: %v, want z-older, b-younger", mine)
		}
		finish(t, holders[0])
	})
	if s := secretOf(t, older); len(s.Data["id_rsa"]) == 0 {
		t.Fatalf("the oldest waiter got no host after the restart: %q", s.Data["error"])
	}
	if handedOver, waits, err := stacktest.StateOf(context.Background(), c(), younger); err != nil || handedOver || !waits {
		t.Fatalf("the younger waiter: handed over %v, waiting %v (%v); want it still waiting", handedOver, waits, err)
	}
	for _, tr := range append(holders[1:], older, younger) {
		finish(t, tr)
	}
	settled(t, ns)
	noBuildUsersLeft(t)
}

// TestAnUnsealedSecretFoundAfterARestartGetsAFreshUser: a secret berth did not seal for the record's build user
// (one a tenant wrote while berth was down, under berth's label and owner) does not pass for a
// hand-over after a restart: the user is made again, and the forged secret replaced.
func TestAnUnsealedSecretFoundAfterARestartGetsAFreshUser(t *testing.T) {
	ns, tr := readyTask(t, "unsealed")
	first := recordOf(t, tr)
	whileStopped(t, func() {
		s := secretOf(t, tr)
		delete(s.Annotations, taskrun.SealAnnotation)
		s.Data["host"] = []byte("someone@elsewhere")
		if err := c().Update(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	})
	secondUserReplacesFirst(t, ns, tr, first)
}

// secondUserReplacesFirst waits for the task to be served again under a second build user,
// the first removed, then ends it.
func secondUserReplacesFirst(t *testing.T, ns string, tr *pipelinev1.TaskRun, first *berthv1.Allocation) {
	t.Helper()
	host := hostOf(t, first.Status.Login)
	eventually(t, "a second build user is ready and the first is gone", func() (bool, error) {
		rec := recordOf(t, tr)
		done, err := stacktest.HandedOver(context.Background(), c(), rec)
		return done && rec.Status.Attempt == 2 && len(rec.Status.Debts) == 0 &&
			!userExists(t, host, first.Status.BuildUser), err
	})
	want := hostops.UserName(string(tr.UID), 2)
	eventually(t, "the secret names the second user", func() (bool, error) {
		s := secretOf(t, tr)
		return strings.HasPrefix(string(s.Data["host"]), want+"@"), nil
	})
	finish(t, tr)
	settled(t, ns)
	noBuildUsersLeft(t)
}

func TestATaskThatEndedWhileBerthWasDownIsCleaned(t *testing.T) {
	ns, tr := readyTask(t, "ended-unseen")
	whileStopped(t, func() { finish(t, tr) })
	settled(t, ns)
	noBuildUsersLeft(t)
}

func TestACleanOwedAcrossARestartIsPaidOnceTheHostIsBack(t *testing.T) {
	ns, tr := readyTask(t, "owed")
	host := hostOf(t, recordOf(t, tr).Status.Login)
	cut(t, host)
	finish(t, tr)
	eventually(t, "the clean failed and is owed", func() (bool, error) {
		rec := recordOf(t, tr)
		return rec.Status.Phase == berthv1.PhaseCleaning && rec.Status.CleanFailures > 0 && len(rec.Status.Debts) == 1, nil
	})
	eventually(t, "the finalizer is gone though the host is down", func() (bool, error) {
		return len(get(t, tr).Finalizers) == 0, nil
	})
	whileStopped(t, func() { restore(t, host) })
	settled(t, ns)
	noBuildUsersLeft(t)
}

// TestSwitchOverAdoptsLabelledTaskRuns: TaskRuns that the controller berth replaces left
// mid-build (labels, finalizer, a build user named the old way) are taken over at berth's
// first start on the cluster, cleaned and released, on what that controller left on the host
// (the build user); one that a tenant labelled alike before the start, with no user on the
// host, is served as a new task.
func TestSwitchOverAdoptsLabelledTaskRuns(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	ctx := context.Background()
	beforeFirstStart(t)
	host := hostsByName()[0]
	labelled := func(name string) *pipelinev1.TaskRun {
		tr := userTaskRun(ns, name, platform, "")
		tr.Labels[contract.AssignedHostLabel] = host.Name
		tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
		tr.Finalizers = []string{contract.Finalizer}
		create(t, tr)
		eventually(t, "the stand-in resolved "+name, func() (bool, error) {
			return get(t, tr).Status.TaskSpec != nil, nil
		})
		return tr
	}
	tr, unproven := labelled("left-behind"), labelled("labelled-before")
	legacy := hostops.LegacyUserName(ns, tr.Name)
	if _, err := host.Run(ctx, "useradd --create-home "+legacy); err != nil {
		t.Fatal(err)
	}
	// The secret the earlier release wrote names its user; berth believes the host's users, not
	// a secret a tenant can write (test/migrate adopts the upstream controller's).
	if err := c().Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: contract.SecretPrefix + tr.Name,
		Labels: map[string]string{contract.SecretLabel: "true"}},
		Data: map[string][]byte{"host": []byte(legacy + "@" + host.Address), "user-dir": []byte("/home/" + legacy)}}); err != nil {
		t.Fatal(err)
	}
	if err := startController(controllerOptions()); err != nil {
		t.Fatal(err)
	}
	phaseIs(t, tr, berthv1.PhaseReady) // an adopted record says Ready: berth wrote no secret to seal
	if rec := recordOf(t, tr); rec.Status.BuildUser != legacy || rec.Status.Login.Host != host.Name {
		t.Fatalf("adopted as %s on %s, want %s on %s", rec.Status.BuildUser, rec.Status.Login.Host, legacy, host.Name)
	}
	// Labels without the user on the host prove nothing: a fresh user, as for any new task.
	rec := ready(t, unproven)
	if want := hostops.UserName(string(unproven.UID), rec.Status.Attempt); !strings.HasPrefix(string(secretOf(t, unproven).Data["host"]), want+"@") {
		t.Fatalf("a TaskRun labelled by its tenant before the start was not served as a new task (user %s, want %s)", rec.Status.BuildUser, want)
	}
	eventually(t, "an AdoptionUnproven Event says why "+unproven.Name+" was not adopted", func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false, err
		}
		return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
			return e.Reason == "AdoptionUnproven" && e.Regarding.Name == unproven.Name
		}), nil
	})
	finish(t, tr)
	finish(t, unproven)
	settled(t, ns)
	if userExists(t, host, legacy) {
		t.Fatalf("the adopted build user %s is still on %s", legacy, host.Name)
	}
	// Adoption happens once: a TaskRun labelled after the switch-over is not taken at its word.
	forged := userTaskRun(ns, "labelled-later", platform, "")
	forged.Labels[contract.AssignedHostLabel] = host.Name
	create(t, forged)
	restartController(t, controllerOptions())
	// The restart may cut the first attempt short (then the user is made again, attempt 2).
	rec = ready(t, forged)
	s := secretOf(t, forged)
	if want := hostops.UserName(string(forged.UID), rec.Status.Attempt); !strings.HasPrefix(string(s.Data["host"]), want+"@") {
		t.Fatalf("a TaskRun labelled after the switch-over got %q, want a fresh user %s", s.Data["host"], want)
	}
	finish(t, forged)
	settled(t, ns)
	noBuildUsersLeft(t)
}

// beforeFirstStart stops the controller and forgets that it ever adopted anything, so that its
// next start is its first on the cluster.
func beforeFirstStart(t *testing.T) {
	t.Helper()
	if err := stack.StopController(); err != nil {
		t.Fatal(err)
	}
	marker := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: devstack.Namespace, Name: taskrun.SwitchoverMarker}}
	if err := client.IgnoreNotFound(c().Delete(context.Background(), marker)); err != nil {
		t.Fatal(err)
	}
}

// TestSwitchOverAdoptsNoSharedUpstreamUser: the controller berth replaces named a build user
// after its TaskRun's name and namespace run together, so a tenant can name a TaskRun in a
// namespace of its own to get another's user. berth adopts neither TaskRun of such a pair,
// releases both, and removes no user: whose it is cannot be told.
func TestSwitchOverAdoptsNoSharedUpstreamUser(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	ctx := context.Background()
	// A namespace that is the end of ns, and a name that takes ns's start: the same text.
	const cut = 6
	lookalikeNS := ns[cut:]
	if err := stack.ControlPlane.EnsureNamespace(ctx, lookalikeNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stacktest.FinishAllOnFailure(t, stack, lookalikeNS) })
	victim, lookalike := userTaskRun(ns, "shared", platform, ""), userTaskRun(lookalikeNS, "shared"+ns[:cut], platform, "")
	user := hostops.UpstreamUserName(ns, victim.Name)
	if other := hostops.UpstreamUserName(lookalikeNS, lookalike.Name); other != user {
		t.Fatalf("the pair's upstream users differ (%s, %s): the test names them wrong", user, other)
	}
	beforeFirstStart(t)
	host := hostsByName()[0]
	if _, err := host.Run(ctx, "useradd --create-home "+user); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := host.Run(context.Background(), "userdel --remove "+user+" 2>/dev/null || true"); err != nil {
			t.Error(err)
		}
	})
	for _, tr := range []*pipelinev1.TaskRun{victim, lookalike} {
		tr.Labels[contract.AssignedHostLabel] = host.Name
		tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
		tr.Finalizers = []string{contract.Finalizer}
		create(t, tr)
		eventually(t, "the stand-in resolved "+tr.Name, func() (bool, error) {
			return get(t, tr).Status.TaskSpec != nil, nil
		})
		// The secret the upstream provision task wrote: labelled, owned by nothing.
		if err := c().Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name,
			Labels: map[string]string{contract.SecretLabel: "true"}},
			Data: map[string][]byte{"host": []byte(user + "@" + host.Address), "user-dir": []byte("/home/" + user)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := startController(controllerOptions()); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*pipelinev1.TaskRun{victim, lookalike} {
		eventually(t, tr.Namespace+"/"+tr.Name+" is released with an AdoptionFailed Event naming the user", func() (bool, error) {
			if cur := get(t, tr); len(cur.Finalizers) > 0 || cur.Labels[contract.AssignedHostLabel] != "" {
				return false, nil
			}
			var events eventsv1.EventList
			if err := c().List(ctx, &events, client.InNamespace(tr.Namespace)); err != nil {
				return false, err
			}
			return slices.ContainsFunc(events.Items, func(e eventsv1.Event) bool {
				return e.Reason == "AdoptionFailed" && e.Regarding.Name == tr.Name && strings.Contains(e.Note, user)
			}), nil
		})
		var rec berthv1.Allocation
		if err := c().Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: string(get(t, tr).UID)}, &rec); !apierrors.IsNotFound(err) {
			t.Errorf("%s/%s has a record (%v): it was adopted", tr.Namespace, tr.Name, err)
		}
	}
	finish(t, victim)
	finish(t, lookalike)
	settled(t, ns)
	settled(t, lookalikeNS)
	if !userExists(t, host, user) {
		t.Errorf("berth removed %s, the user two TaskRuns share", user)
	}
}
