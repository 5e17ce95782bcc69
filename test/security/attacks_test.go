package security_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/devstack"
	"github.com/berth-ci/berth/internal/testground/stacktest"
)

// slotWatch follows berth's records and counts the tasks holding each host, at every change.
type slotWatch struct {
	mu    sync.Mutex
	on    map[string]string // record → host it holds
	worst map[string]int
}

func watchSlots(t *testing.T) *slotWatch {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: admin().Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &berthv1.AllocationList{}, client.InNamespace(devstack.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop(); cancel() })
	s := &slotWatch{on: map[string]string{}, worst: map[string]int{}}
	go func() {
		for ev := range w.ResultChan() {
			rec, ok := ev.Object.(*berthv1.Allocation)
			if !ok {
				continue
			}
			host := ""
			if ev.Type != watch.Deleted && rec.Status.Login != nil &&
				(rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady) {
				host = rec.Status.Login.Host
			}
			s.mu.Lock()
			if host == "" {
				delete(s.on, rec.Name)
			} else {
				s.on[rec.Name] = host
			}
			count := map[string]int{}
			for _, h := range s.on {
				count[h]++
			}
			for h, n := range count {
				s.worst[h] = max(s.worst[h], n)
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *slotWatch) verify(t *testing.T, capacity int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, n := range s.worst {
		if n > capacity {
			t.Errorf("host %s held %d tasks at once; its concurrency is %d", h, n, capacity)
		}
	}
	if len(s.worst) == 0 {
		t.Error("no task ever held a host: the attack was not exercised")
	}
}

// noAdminKeyIn fails if any secret of the namespace holds a key whose public half is an admin key.
func noAdminKeyIn(t *testing.T, ns string) {
	t.Helper()
	admins := stacktest.AdminPublicKeys(t, admin(), devstack.Namespace)
	var list corev1.SecretList
	if err := admin().List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		for field, v := range s.Data {
			k, err := ssh.ParsePrivateKey(v)
			if err != nil {
				continue
			}
			for _, a := range admins {
				if string(k.PublicKey().Marshal()) == string(a) {
					t.Errorf("secret %s/%s field %s holds a host's ADMIN key", ns, s.Name, field)
				}
			}
		}
	}
}

func mirrorReverted(t *testing.T, tr *pipelinev1.TaskRun) bool {
	t.Helper()
	var events eventsv1.EventList
	if err := admin().List(context.Background(), &events, client.InNamespace(tr.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Reason == "MirrorReverted" && e.Regarding.Name == tr.Name {
			return true
		}
	}
	return false
}

func TestTenantCannotReachBerthsNamespace(t *testing.T) {
	tn := newTenant(t, "a")
	ctx := context.Background()
	err := tn.c.Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: devstack.AdminKeySecret}, &corev1.Secret{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("reading the admin key secret: %v, want Forbidden", err)
	}
	if err := tn.c.List(ctx, &berthv1.AllocationList{}, client.InNamespace(devstack.Namespace)); !apierrors.IsForbidden(err) {
		t.Errorf("listing berth's records: %v, want Forbidden", err)
	}
	tr := tn.taskRun("smuggled", platform)
	tr.Namespace = devstack.Namespace
	tr.Labels[contract.TaskTypeLabel] = contract.TaskTypeProvision
	if err := tn.c.Create(ctx, tr); !apierrors.IsForbidden(err) {
		t.Errorf("creating a TaskRun in berth's namespace: %v, want Forbidden", err)
	}
}

// TestForgedAssignedHostGetsNoSlot: TaskRuns created already labelled with a host get no slot
// on it beyond its concurrency; berth decides, and rewrites the label to what it decided.
func TestForgedAssignedHostGetsNoSlot(t *testing.T) {
	applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	slots := watchSlots(t)
	target := hostsByName()[0].Name
	var trs []*pipelinev1.TaskRun
	for i := range 5 {
		tr := tn.taskRun(fmt.Sprintf("forged-%d", i), platform)
		tr.Labels[contract.AssignedHostLabel] = target
		trs = append(trs, tn.create(t, tr))
	}
	ready, waiting := 0, 0
	for _, tr := range trs {
		eventually(t, tr.Name+" is decided", func() (bool, error) {
			var rec berthv1.Allocation
			err := admin().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(tr.UID)}, &rec)
			return err == nil && (rec.Status.Phase == berthv1.PhaseReady || rec.Status.Phase == berthv1.PhaseWaiting), client.IgnoreNotFound(err)
		})
	}
	for _, tr := range trs {
		rec := record(t, tr)
		want := ""
		if rec.Status.Phase == berthv1.PhaseReady {
			ready++
			want = rec.Status.Login.Host
		} else {
			waiting++
		}
		eventually(t, "the label of "+tr.Name+" says what berth decided", func() (bool, error) {
			return get(t, tr).Labels[contract.AssignedHostLabel] == want, nil
		})
	}
	if ready != hostCount || waiting != len(trs)-hostCount {
		t.Fatalf("%d tasks ready and %d waiting; want one per host (%d) and the rest waiting", ready, waiting, hostCount)
	}
	for _, tr := range trs {
		finish(t, tr)
	}
	settled(t, tn.ns)
	slots.verify(t, 1)
	noBuildUsersLeft(t)
}

// TestForgedAssignedHostOnWindowsGetsNoAdminKey: a Windows platform served from a host whose
// admin secret holds the admin key; the tenant's secret must never hold it.
func TestForgedAssignedHostOnWindowsGetsNoAdminKey(t *testing.T) {
	h := hostsByName()[0]
	applyConfig(t, 1, map[string]string{
		"host.win-1.address": h.Address, "host.win-1.user": "root", "host.win-1.platform": "windows/amd64",
		"host.win-1.secret": devstack.AdminKeySecret, "host.win-1.concurrency": "2",
	})
	defer applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	tr := tn.taskRun("win", "windows/amd64")
	tr.Labels[contract.AssignedHostLabel] = "win-1"
	tn.create(t, tr)
	s := secretOf(t, tr)
	if len(s.Data["id_rsa"]) > 0 {
		t.Errorf("the Windows task got a key, though its host is no Windows host")
	}
	if len(s.Data["error"]) == 0 {
		t.Errorf("the Windows task's secret carries no error: %v", s.Data)
	}
	noAdminKeyIn(t, tn.ns)
	finish(t, tr)
	// The Windows commands berth tried on this Linux host left a clean it can never do.
	stacktest.ForgetHost(t, stack, "win-1")
	settled(t, tn.ns)
	noBuildUsersLeft(t)
}

// TestForgedTaskTypeAndWaitingLabelsChangeNothing: labels that mean something on berth's own
// TaskRuns mean nothing on a tenant's; the task is served and cleaned like any other.
func TestForgedTaskTypeAndWaitingLabelsChangeNothing(t *testing.T) {
	applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	tr := tn.taskRun("forged-type", platform)
	tr.Labels[contract.TaskTypeLabel] = contract.TaskTypeClean
	tr.Labels[contract.WaitingForPlatformLabel] = contract.PlatformLabelValue(platform)
	tn.create(t, tr)
	if s := secretOf(t, tr); len(s.Data["id_rsa"]) == 0 {
		t.Fatalf("the task was not served: %s", s.Data["error"])
	}
	rec := phaseIs(t, tr, berthv1.PhaseReady)
	eventually(t, "waiting-for-platform is gone from the served task", func() (bool, error) {
		return get(t, tr).Labels[contract.WaitingForPlatformLabel] == "", nil
	})
	finish(t, tr)
	settled(t, tn.ns)
	for _, u := range buildUsers(t, hostNamed(t, rec.Status.Login.Host)) {
		if u == rec.Status.BuildUser {
			t.Fatalf("%s was not removed", u)
		}
	}
	noBuildUsersLeft(t)
}

// TestLabelRemovalAndChangeMidBuild: the tenant removes, then redirects, assigned-host while
// its build runs. berth reverts both (with an Event), and cleans the right host when the task
// ends; the other host is not touched.
func TestLabelRemovalAndChangeMidBuild(t *testing.T) {
	applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	tr := tn.create(t, tn.taskRun("moved", platform))
	rec := phaseIs(t, tr, berthv1.PhaseReady)
	home := rec.Status.Login.Host
	var elsewhere string
	for _, h := range hostsByName() {
		if h.Name != home {
			elsewhere = h.Name
		}
	}
	otherBefore := hostTree(t, hostNamed(t, elsewhere))

	tn.relabel(t, tr, func(l map[string]string) { delete(l, contract.AssignedHostLabel) })
	eventually(t, "the removed label is back", func() (bool, error) {
		return get(t, tr).Labels[contract.AssignedHostLabel] == home && mirrorReverted(t, tr), nil
	})
	tn.relabel(t, tr, func(l map[string]string) { l[contract.AssignedHostLabel] = elsewhere })
	eventually(t, "the redirected label is back", func() (bool, error) {
		return get(t, tr).Labels[contract.AssignedHostLabel] == home, nil
	})
	if got := record(t, tr).Status.Login.Host; got != home {
		t.Fatalf("the record moved to %s", got)
	}
	finish(t, tr)
	settled(t, tn.ns)
	if len(get(t, tr).Finalizers) != 0 {
		t.Fatal("the finalizer is stuck")
	}
	for _, u := range buildUsers(t, hostNamed(t, home)) {
		if u == rec.Status.BuildUser {
			t.Fatalf("%s is left on %s", u, home)
		}
	}
	if hostTree(t, hostNamed(t, elsewhere)) != otherBefore {
		t.Errorf("host %s, which the tenant named, was changed", elsewhere)
	}
	noBuildUsersLeft(t)
}

// plantLinks logs in as the build user with the key from the tenant's secret and plants links
// to root's files where root has written before.
func plantLinks(t *testing.T, s *corev1.Secret, rec *berthv1.Allocation) {
	t.Helper()
	signer, err := ssh.ParsePrivateKey(s.Data["id_rsa"])
	if err != nil {
		t.Fatal(err)
	}
	plant := `set -e; cd ~; rm -rf build; ln -s /etc build; ln -s /root rootlink
mv .ssh/authorized_keys keys; ln -s /etc/sudoers.d/x .ssh/authorized_keys.new; ln -s /etc/shadow .ssh/known_hosts
ln -s /etc/sudoers.d/keep .ssh/rc; cp keys .ssh/authorized_keys`
	if out, err := hostNamed(t, rec.Status.Login.Host).RunAs(context.Background(), rec.Status.BuildUser, signer, plant); err != nil {
		t.Fatalf("planting links as the build user: %v %s", err, out)
	}
}

// tamperAfterPlanting runs one secret attack: links planted in the home, then the secret
// deleted or edited. berth writes the secret back holding only an error, never provisions
// into that home again, and after the task /etc and /root of the host are as before it.
func tamperAfterPlanting(t *testing.T, tamper func(tn *tenant, s *corev1.Secret)) {
	applyConfig(t, 1, nil)
	before := map[string]string{}
	for _, h := range hostsByName() {
		if _, err := h.Run(context.Background(), "mkdir -p /etc/sudoers.d && touch /etc/sudoers.d/keep"); err != nil {
			t.Fatal(err)
		}
		before[h.Name] = hostTree(t, h)
	}
	tn := newTenant(t, "a")
	tr := tn.create(t, tn.taskRun("tamper", platform))
	s := secretOf(t, tr)
	rec := phaseIs(t, tr, berthv1.PhaseReady)
	plantLinks(t, s, rec)
	tamper(tn, s)
	eventually(t, "the secret is written back holding only an error", func() (bool, error) {
		var now corev1.Secret
		err := admin().Get(context.Background(), client.ObjectKeyFromObject(s), &now)
		return err == nil && len(now.Data) == 1 && strings.Contains(string(now.Data["error"]), "changed or deleted"), client.IgnoreNotFound(err)
	})
	if r := record(t, tr); !r.Status.SecretTampered || r.Status.BuildUser != rec.Status.BuildUser || r.Status.Attempt != rec.Status.Attempt {
		t.Fatalf("after the tamper the record is %+v", r.Status)
	}
	noAdminKeyIn(t, tn.ns)
	finish(t, tr)
	settled(t, tn.ns)
	noBuildUsersLeft(t)
	for _, h := range hostsByName() {
		if after := hostTree(t, h); after != before[h.Name] {
			t.Errorf("host %s: files outside the build user's home changed", h.Name)
		}
	}
}

func TestSecretDeletedAfterPlantingLinks(t *testing.T) {
	tamperAfterPlanting(t, func(tn *tenant, s *corev1.Secret) {
		if err := tn.c.Delete(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSecretEditedAfterPlantingLinks(t *testing.T) {
	tamperAfterPlanting(t, func(tn *tenant, s *corev1.Secret) {
		edited := s.DeepCopy()
		edited.Data["host"] = []byte("root@" + string(s.Data["host"])[strings.Index(string(s.Data["host"]), "@")+1:])
		if err := tn.c.Update(context.Background(), edited); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTaskRunNameReuse: a TaskRun deleted and created again under the same name is another
// task with another build user; the first one's clean never touches the second's.
func TestTaskRunNameReuse(t *testing.T) {
	applyConfig(t, 2, nil)
	tn := newTenant(t, "a")
	ctx := context.Background()
	first := tn.create(t, tn.taskRun("reused", platform))
	firstRec := phaseIs(t, first, berthv1.PhaseReady)
	if err := tn.c.Delete(ctx, get(t, first)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first TaskRun is gone", func() (bool, error) {
		err := admin().Get(ctx, client.ObjectKeyFromObject(first), &pipelinev1.TaskRun{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	second := tn.create(t, tn.taskRun("reused", platform))
	secondRec := phaseIs(t, second, berthv1.PhaseReady)
	if secondRec.Status.BuildUser == firstRec.Status.BuildUser {
		t.Fatalf("both TaskRuns got build user %s", secondRec.Status.BuildUser)
	}
	eventually(t, "the first task's record is gone", func() (bool, error) {
		err := admin().Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: string(first.UID)}, &berthv1.Allocation{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	signer, err := ssh.ParsePrivateKey(secretOf(t, second).Data["id_rsa"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hostNamed(t, secondRec.Status.Login.Host).RunAs(ctx, secondRec.Status.BuildUser, signer, "true"); err != nil {
		t.Fatalf("the second task's user stopped working after the first was cleaned: %v", err)
	}
	finish(t, second)
	settled(t, tn.ns)
	noBuildUsersLeft(t)
}

// TestHostileSudoCommands: every form that would grant more than the listed commands keeps its
// platform unserved with an error naming sudo-commands, and no sudo rule reaches any host.
func TestHostileSudoCommands(t *testing.T) {
	applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	for i, hostile := range []string{"/bin/ls, ALL", "/usr/bin/*", "/bin/", "(root) /bin/sh", "!/bin/sh", "/bin/ls !/bin/sh",
		"sudoedit /etc/x", "/usr/bin/sudoedit", "/usr/bin/env =", "/bin/cat :x", "/bin/sh -c x#y", `/bin/echo "x"`, "/bin/ls ^a$"} {
		extra := map[string]string{"dynamic-platforms": "linux/arm64"}
		for k, v := range map[string]string{"type": "aws", "region": "us-east-1", "ami": "ami-0123456789abcdef0",
			"instance-type": "m6g.large", "key-name": "builders", "aws-secret": "aws-account", "ssh-secret": devstack.AdminKeySecret,
			"security-group-id": "sg-0123456789abcdef0", "subnet-id": "subnet-0123456789abcdef0", "max-instances": "2", "sudo-commands": hostile} {
			extra["dynamic.linux-arm64."+k] = v
		}
		applyConfig(t, 1, extra)
		tr := tn.create(t, tn.taskRun(fmt.Sprintf("sudo-%d", i), "linux/arm64"))
		msg := string(secretOf(t, tr).Data["error"])
		if !strings.Contains(msg, "sudo-commands") {
			t.Errorf("%q: the task's error does not name sudo-commands: %q", hostile, msg)
		}
		finish(t, tr)
	}
	applyConfig(t, 1, nil)
	for _, h := range hostsByName() {
		if out, err := h.Run(context.Background(), "ls /etc/sudoers.d 2>/dev/null | grep berth || true"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("host %s has sudo rules %q (%v)", h.Name, out, err)
		}
	}
	settled(t, tn.ns)
}

// TestFloodingNamespaceDoesNotStarveAnother: one tenant queues many tasks; another tenant's
// single task gets the next free slot.
func TestFloodingNamespaceDoesNotStarveAnother(t *testing.T) {
	applyConfig(t, 1, nil)
	flood, quiet := newTenant(t, "flood"), newTenant(t, "quiet")
	slots := watchSlots(t)
	var floods []*pipelinev1.TaskRun
	for i := range 20 {
		floods = append(floods, flood.create(t, flood.taskRun(fmt.Sprintf("f-%02d", i), platform)))
	}
	for _, tr := range floods[:hostCount] {
		phaseIs(t, tr, berthv1.PhaseReady)
	}
	lone := quiet.create(t, quiet.taskRun("lone", platform))
	phaseIs(t, lone, berthv1.PhaseWaiting)
	finish(t, floods[0])
	phaseIs(t, lone, berthv1.PhaseReady)
	waiting := 0
	for _, tr := range floods[hostCount:] {
		if record(t, tr).Status.Phase == berthv1.PhaseWaiting {
			waiting++
		}
	}
	if waiting != len(floods)-hostCount {
		t.Fatalf("%d of the flood's later tasks still wait, want all %d: the quiet tenant was not next", waiting, len(floods)-hostCount)
	}
	finish(t, lone)
	for _, tr := range floods[1:] {
		phaseIs(t, tr, berthv1.PhaseReady)
		finish(t, tr)
	}
	settled(t, flood.ns)
	settled(t, quiet.ns)
	slots.verify(t, 1)
	noBuildUsersLeft(t)
}
