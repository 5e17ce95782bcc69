package security_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/hostops"
)

func mirrorReverted(t *testing.T, tr *pipelinev1.TaskRun) bool {
	t.Helper()
	var events eventsv1.EventList
	if err := admin().List(context.Background(), &events, client.InNamespace(tr.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Reason == "MirrorReverted" && e.Regarding.Name == tr.Name && e.Regarding.UID == get(t, tr).UID {
			return true
		}
	}
	return false
}

// servedWithKey asserts that the task's secret is a working key for a fresh build user named
// after the TaskRun's UID, and returns the secret.
func servedWithKey(t *testing.T, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) *corev1.Secret {
	t.Helper()
	s := secretOf(t, tr)
	want := hostops.UserName(string(tr.UID), rec.Status.Attempt)
	if rec.Status.BuildUser != want || !strings.HasPrefix(string(s.Data["host"]), want+"@") || len(s.Data["id_rsa"]) == 0 {
		t.Fatalf("%s was not served: record user %s, secret host %q, error %q; want user %s", tr.Name, rec.Status.BuildUser, s.Data["host"], s.Data["error"], want)
	}
	out, err := loginWith(t, hostNamed(t, rec.Status.Login.Host), want, s, "id -un")
	if err != nil || strings.TrimSpace(out) != want {
		t.Fatalf("logging in with %s's secret: %q %v", tr.Name, out, err)
	}
	return s
}

func TestTenantCannotReachBerthsNamespace(t *testing.T) {
	tn := newTenant(t, "a")
	ctx := context.Background()
	err := tn.c.Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: devstack.AdminKeySecret}, &corev1.Secret{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("reading the admin key secret: %v, want Forbidden", err)
	}
	if err := tn.c.List(ctx, &corev1.SecretList{}, client.InNamespace(devstack.Namespace)); !apierrors.IsForbidden(err) {
		t.Errorf("listing the secrets of berth's namespace: %v, want Forbidden", err)
	}
	if err := tn.c.List(ctx, &corev1.SecretList{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing secrets in all namespaces: %v, want Forbidden", err)
	}
	if err := tn.c.List(ctx, &berthv1.AllocationList{}, client.InNamespace(devstack.Namespace)); !apierrors.IsForbidden(err) {
		t.Errorf("listing berth's records: %v, want Forbidden", err)
	}
	err = tn.c.Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: "host-config"}, &corev1.ConfigMap{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("reading the host config: %v, want Forbidden", err)
	}
	tr := tn.taskRun("smuggled", platform)
	tr.Namespace = devstack.Namespace
	tr.Labels[contract.TaskTypeLabel] = contract.TaskTypeProvision
	if err := tn.c.Create(ctx, tr); !apierrors.IsForbidden(err) {
		t.Errorf("creating a TaskRun in berth's namespace: %v, want Forbidden", err)
	}
	settled(t, tn.ns)
	noBuildUsersLeft(t)
}

// TestForgedAssignedHostGetsNoSlot: more TaskRuns than one host takes, all created already
// labelled with that host. berth decides from its own ledger: the host never holds more tasks
// than its concurrency, and every label is rewritten to what berth decided.
func TestForgedAssignedHostGetsNoSlot(t *testing.T) {
	const concurrency = 2
	applyConfig(t, concurrency, nil)
	tn := newTenant(t, "a")
	records := watchRecords(t)
	target := hostsByName()[0]
	n := concurrency*hostCount + 2
	var trs []*pipelinev1.TaskRun
	for i := range n {
		tr := tn.taskRun(fmt.Sprintf("forged-%d", i), platform)
		tr.Labels[contract.AssignedHostLabel] = target.Name
		trs = append(trs, tn.create(t, tr))
	}
	for _, tr := range trs {
		eventually(t, tr.Name+" is decided", func() (bool, error) {
			handedOver, waits, err := stacktest.StateOf(context.Background(), admin(), tr)
			return handedOver || waits, err
		})
	}
	ready, waiting, onTarget := 0, 0, 0
	for _, tr := range trs {
		handedOver, waits, err := stacktest.StateOf(context.Background(), admin(), tr)
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		switch {
		case handedOver:
			ready++
			want = record(t, tr).Status.Login.Host
			if want == target.Name {
				onTarget++
			}
		case waits:
			waiting++
		}
		eventually(t, "the label of "+tr.Name+" says what berth decided", func() (bool, error) {
			got := get(t, tr).Labels[contract.AssignedHostLabel]
			return got == want, fmt.Errorf("assigned-host %q, berth decided %q", got, want)
		})
	}
	if ready != concurrency*hostCount || waiting != n-concurrency*hostCount || onTarget > concurrency {
		t.Fatalf("%d tasks ready (%d on %s) and %d waiting; want %d per host and the rest waiting", ready, onTarget, target.Name, waiting, concurrency)
	}
	for _, h := range stack.Fleet.Hosts {
		if users := buildUsers(t, h); len(users) > concurrency {
			t.Errorf("host %s has %d build users %v; its concurrency is %d", h.Name, len(users), users, concurrency)
		}
	}
	for _, tr := range trs {
		finish(t, tr)
	}
	settled(t, tn.ns)
	records.verify(t, concurrency)
	noBuildUsersLeft(t)
}

// TestForgedAssignedHostOnWindowsGetsNoAdminKey: a Windows platform configured on a host
// reached with the admin key (a Linux host here, so making a Windows user there fails), and
// tasks labelled with that host, with a Linux host and with localhost. Each gets an error, and
// no secret of the tenant ever holds an admin key.
func TestForgedAssignedHostOnWindowsGetsNoAdminKey(t *testing.T) {
	h := hostsByName()[0]
	applyConfig(t, 1, map[string]string{
		"host.win-1.address": h.Address, "host.win-1.user": "root", "host.win-1.platform": "windows/amd64",
		"host.win-1.secret": devstack.AdminKeySecret, "host.win-1.concurrency": "3", // a slot per task: a failed attempt keeps its slot until cleaned
	})
	defer applyConfig(t, 1, nil)
	before := allHostFiles(t)
	tn := newTenant(t, "a")
	var trs []*pipelinev1.TaskRun
	for i, forged := range []string{"win-1", h.Name, contract.Localhost} {
		tr := tn.taskRun(fmt.Sprintf("win-%d", i), "windows/amd64")
		tr.Labels[contract.AssignedHostLabel] = forged
		trs = append(trs, tn.create(t, tr))
	}
	for _, tr := range trs {
		s := secretOf(t, tr)
		if len(s.Data["id_rsa"]) > 0 || len(s.Data["otp"]) > 0 {
			t.Errorf("%s: the Windows task got a key or token, though no Windows user could be made", tr.Name)
		}
		if len(s.Data["error"]) == 0 {
			t.Errorf("%s: the Windows task's secret carries no error: %v", tr.Name, s.Data)
		}
	}
	noAdminKeyIn(t, tn.ns)
	for _, tr := range trs {
		finish(t, tr)
	}
	// The Windows commands berth tried on this Linux host left a clean it can never do; the
	// operator forgets the host, as they would a dead one.
	stacktest.ForgetHost(t, stack, "win-1")
	settled(t, tn.ns)
	noBuildUsersLeft(t)
	sameHostFiles(t, before)
}

// TestForgedTaskTypeAndWaitingLabelsChangeNothing: labels that mean something on berth's own
// TaskRuns (task-type, in its namespace) or that berth writes (waiting-for-platform) mean
// nothing on a tenant's: each task is served like any other, and cleaned after.
func TestForgedTaskTypeAndWaitingLabelsChangeNothing(t *testing.T) {
	applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	var trs []*pipelinev1.TaskRun
	for _, taskType := range []string{contract.TaskTypeClean, contract.TaskTypeProvision, contract.TaskTypeUpdate} {
		tr := tn.taskRun("forged-"+taskType, platform)
		tr.Labels[contract.TaskTypeLabel] = taskType
		tr.Labels[contract.WaitingForPlatformLabel] = "linux-x86_64"
		tr.Labels[contract.UserTaskNameLabel] = "someone-else"
		tr.Labels[contract.UserTaskNamespaceLabel] = devstack.Namespace
		trs = append(trs, tn.create(t, tr))
	}
	recs := map[string]*berthv1.Allocation{}
	for _, tr := range trs {
		rec := ready(t, tr)
		recs[tr.Name] = rec
		servedWithKey(t, tr, rec)
		eventually(t, "the labels of "+tr.Name+" say what berth decided", func() (bool, error) {
			l := get(t, tr).Labels
			return l[contract.WaitingForPlatformLabel] == "" && l[contract.AssignedHostLabel] == rec.Status.Login.Host &&
				l[contract.TargetPlatformLabel] == contract.PlatformLabelValue(platform), fmt.Errorf("labels %v", l)
		})
		if get(t, tr).IsDone() {
			t.Errorf("%s was ended by something other than its own build", tr.Name)
		}
	}
	for _, tr := range trs {
		finish(t, tr)
	}
	settled(t, tn.ns)
	for _, tr := range trs {
		rec := recs[tr.Name]
		if userExists(t, hostNamed(t, rec.Status.Login.Host), rec.Status.BuildUser) {
			t.Errorf("%s's build user %s was not removed", tr.Name, rec.Status.BuildUser)
		}
	}
	noBuildUsersLeft(t)
}

// TestLabelRemovalAndChangeMidBuild: the tenant removes, then redirects, assigned-host while
// its build runs. berth reverts both (with an Event) and cleans the right host when the task
// ends; the host the tenant named is not touched.
func TestLabelRemovalAndChangeMidBuild(t *testing.T) {
	applyConfig(t, 1, nil)
	tn := newTenant(t, "a")
	tr := tn.create(t, tn.taskRun("moved", platform))
	rec := ready(t, tr)
	servedWithKey(t, tr, rec)
	home := hostNamed(t, rec.Status.Login.Host)
	var elsewhere string
	for _, h := range hostsByName() {
		if h.Name != home.Name {
			elsewhere = h.Name
		}
	}
	otherBefore := hostFiles(t, hostNamed(t, elsewhere))

	tn.relabel(t, tr, func(l map[string]string) { delete(l, contract.AssignedHostLabel) })
	eventually(t, "the removed label is back, with an Event", func() (bool, error) {
		return get(t, tr).Labels[contract.AssignedHostLabel] == home.Name && mirrorReverted(t, tr), nil
	})
	tn.relabel(t, tr, func(l map[string]string) { l[contract.AssignedHostLabel] = elsewhere })
	eventually(t, "the redirected label is back", func() (bool, error) {
		return get(t, tr).Labels[contract.AssignedHostLabel] == home.Name, nil
	})
	if got := record(t, tr); got.Status.Login.Host != home.Name || got.Status.BuildUser != rec.Status.BuildUser {
		t.Fatalf("the record moved to %s/%s", got.Status.Login.Host, got.Status.BuildUser)
	}
	if !userExists(t, home, rec.Status.BuildUser) {
		t.Fatalf("build user %s vanished from %s while its task runs", rec.Status.BuildUser, home.Name)
	}
	// The tenant leaves the label pointing elsewhere as the task ends.
	tn.relabel(t, tr, func(l map[string]string) { l[contract.AssignedHostLabel] = elsewhere })
	finish(t, tr)
	settled(t, tn.ns)
	if f := get(t, tr).Finalizers; len(f) != 0 {
		t.Fatalf("the finalizer is stuck: %v", f)
	}
	if userExists(t, home, rec.Status.BuildUser) {
		t.Fatalf("%s is left on %s", rec.Status.BuildUser, home.Name)
	}
	if changes := otherBefore.diff(hostFiles(t, hostNamed(t, elsewhere))); len(changes) > 0 {
		t.Errorf("host %s, which the tenant named, was changed: %s", elsewhere, limit(changes, 20))
	}
	noBuildUsersLeft(t)
}

// plant is what a build user leaves in its home for root to trip over: links from every place
// root has written or might write to root's own files, and files where ssh reads its config.
// The last line replaces authorized_keys itself, so it cannot log in again after this.
const plant = `set -e; cd ~
rm -rf build; ln -s /etc build
ln -s /root x
ln -s /etc/sudoers.d/keep .ssh/rc
ln -s /etc/shadow .ssh/known_hosts
ln -s /etc/sudoers.d/y .ssh/authorized_keys2
printf 'Host *\n  ProxyCommand /bin/sh -c "touch /etc/pwned"\n' > .ssh/config
echo 'PATH=/tmp' > .ssh/environment
ln -s /etc/sudoers.d/x .ssh/authorized_keys.new
ln -sfn /etc/sudoers.d/x .ssh/authorized_keys
`

// tamperAfterPlanting runs one secret attack: links planted in the home, then the secret
// changed by the tenant. berth writes the secret back holding only an error, never touches the
// build user again until it removes it, and after the task /etc, /root and /home of every host
// are as they were before it.
func tamperAfterPlanting(t *testing.T, tamper func(tn *tenant, s *corev1.Secret)) {
	applyConfig(t, 1, nil)
	for _, h := range stack.Fleet.Hosts {
		// A file the links can point at, so a write through them would change something.
		if err := os.MkdirAll(filepath.Join(h.EtcDir, "sudoers.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.EtcDir, "sudoers.d", "keep"), nil, 0o440); err != nil {
			t.Fatal(err)
		}
	}
	before := allHostFiles(t)
	tn := newTenant(t, "a")
	tr := tn.create(t, tn.taskRun("tamper", platform))
	rec := ready(t, tr)
	s := servedWithKey(t, tr, rec)
	host := hostNamed(t, rec.Status.Login.Host)
	if out, err := loginWith(t, host, rec.Status.BuildUser, s, plant); err != nil {
		t.Fatalf("planting links as the build user: %v %s", err, out)
	}
	planted := homeOf(t, host, rec.Status.BuildUser)

	tamper(tn, s)
	rewritten := errorOnlySecret(t, tr, "")
	after := record(t, tr)
	if !after.Status.SecretTampered || after.Status.BuildUser != rec.Status.BuildUser || after.Status.Attempt != rec.Status.Attempt {
		t.Fatalf("after the tamper the record is %+v", after.Status)
	}
	// Again, on the error secret berth wrote back: still nothing but an error, still nothing done
	// on the host.
	if err := tn.c.Delete(context.Background(), rewritten); err != nil {
		t.Fatal(err)
	}
	errorOnlySecret(t, tr, rewritten.UID)
	if again := record(t, tr); again.Status.Attempt != rec.Status.Attempt || again.Status.Phase != berthv1.PhaseProvisioning || !again.Status.SecretTampered {
		t.Fatalf("berth provisioned again after the tamper: %+v", again.Status)
	}
	if changes := planted.diff(homeOf(t, host, rec.Status.BuildUser)); len(changes) > 0 {
		t.Errorf("berth touched the tampered build user's home: %s", limit(changes, 20))
	}
	for _, f := range []string{"sudoers.d/x", "sudoers.d/y", "pwned"} {
		if _, err := os.Lstat(filepath.Join(host.EtcDir, f)); !os.IsNotExist(err) {
			t.Errorf("/etc/%s exists on %s: root wrote through a planted link", f, host.Name)
		}
	}
	noAdminKeyIn(t, tn.ns)

	finish(t, tr)
	settled(t, tn.ns)
	if userExists(t, host, rec.Status.BuildUser) {
		t.Errorf("build user %s is left on %s", rec.Status.BuildUser, host.Name)
	}
	noBuildUsersLeft(t)
	sameHostFiles(t, before)
}

// errorOnlySecret waits for the task's secret to hold nothing but an error saying it was
// changed, and for it to be another object than notUID.
func errorOnlySecret(t *testing.T, tr *pipelinev1.TaskRun, notUID types.UID) *corev1.Secret {
	t.Helper()
	var now corev1.Secret
	eventually(t, "the secret is written back holding only an error", func() (bool, error) {
		err := admin().Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}, &now)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		keys := make([]string, 0, len(now.Data))
		for k := range now.Data {
			keys = append(keys, k)
		}
		return now.UID != notUID && len(now.Data) == 1 && strings.Contains(string(now.Data["error"]), "changed"),
			fmt.Errorf("secret %s holds %v", now.UID, keys)
	})
	return &now
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
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		block, err := ssh.MarshalPrivateKey(priv, "the tenant's own")
		if err != nil {
			t.Fatal(err)
		}
		edited := s.DeepCopy()
		edited.Data["id_rsa"] = pem.EncodeToMemory(block)
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
	firstRec := ready(t, first)
	servedWithKey(t, first, firstRec)
	if err := tn.c.Delete(ctx, get(t, first)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first TaskRun is gone", func() (bool, error) {
		err := admin().Get(ctx, client.ObjectKeyFromObject(first), &pipelinev1.TaskRun{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	second := tn.create(t, tn.taskRun("reused", platform))
	secondRec := ready(t, second)
	if secondRec.Status.BuildUser == firstRec.Status.BuildUser {
		t.Fatalf("both TaskRuns got build user %s", secondRec.Status.BuildUser)
	}
	for _, c := range []struct {
		tr  *pipelinev1.TaskRun
		rec *berthv1.Allocation
	}{{first, firstRec}, {second, secondRec}} {
		if uid := strings.ReplaceAll(string(c.tr.UID), "-", ""); !strings.Contains(c.rec.Status.BuildUser, uid[:24]) {
			t.Errorf("build user %s does not carry the UID %s of its TaskRun", c.rec.Status.BuildUser, c.tr.UID)
		}
	}
	eventually(t, "the first task's record is gone", func() (bool, error) {
		err := admin().Get(ctx, client.ObjectKey{Namespace: devstack.Namespace, Name: string(first.UID)}, &berthv1.Allocation{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if userExists(t, hostNamed(t, firstRec.Status.Login.Host), firstRec.Status.BuildUser) {
		t.Errorf("the first task's user %s is left", firstRec.Status.BuildUser)
	}
	secondHost := hostNamed(t, secondRec.Status.Login.Host)
	if !userExists(t, secondHost, secondRec.Status.BuildUser) {
		t.Fatalf("the second task's user %s was removed while its task runs", secondRec.Status.BuildUser)
	}
	s := servedWithKey(t, second, secondRec)
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != second.UID {
		t.Errorf("the second task's secret is owned by %+v, want the second TaskRun %s", s.OwnerReferences, second.UID)
	}
	finish(t, second)
	settled(t, tn.ns)
	noBuildUsersLeft(t)
}

// TestHostileSudoCommands: every form that would grant more than the listed commands keeps its
// platform unserved with an error naming sudo-commands, and no sudo rule reaches any host.
func TestHostileSudoCommands(t *testing.T) {
	applyConfig(t, 1, nil)
	before := map[string]tree{}
	for _, h := range stack.Fleet.Hosts {
		before[h.Name] = sudoRules(t, h)
	}
	tn := newTenant(t, "a")
	for i, hostile := range []string{"/bin/ls, ALL", "/usr/bin/*", "/bin/", "(root) /bin/sh", "!/bin/sh", "/bin/ls !/bin/sh",
		"sudoedit /etc/x", "/usr/bin/sudoedit", "/usr/bin/env =", "/bin/cat :x", "/bin/sh -c x#y", `/bin/echo "x"`, "/bin/ls ^a$",
		"/bin/ls\n%sudo ALL=(ALL) NOPASSWD: ALL", "ALL"} {
		extra := map[string]string{"dynamic-platforms": "linux/arm64"}
		for k, v := range map[string]string{"type": "aws", "region": "us-east-1", "ami": "ami-0123456789abcdef0",
			"instance-type": "m6g.large", "key-name": "builders", "aws-secret": "aws-account", "ssh-secret": devstack.AdminKeySecret,
			"security-group-id": "sg-0123456789abcdef0", "subnet-id": "subnet-0123456789abcdef0", "max-instances": "2", "sudo-commands": hostile} {
			extra["dynamic.linux-arm64."+k] = v
		}
		applyConfig(t, 1, extra)
		tr := tn.create(t, tn.taskRun(fmt.Sprintf("sudo-%d", i), "linux/arm64"))
		s := secretOf(t, tr)
		if msg := string(s.Data["error"]); !strings.Contains(msg, "sudo-commands") || len(s.Data["id_rsa"]) > 0 {
			t.Errorf("%q: the task's secret is not an error naming sudo-commands: %q (keys %d)", hostile, msg, len(s.Data))
		}
		finish(t, tr)
	}
	applyConfig(t, 1, nil)
	settled(t, tn.ns)
	for _, h := range stack.Fleet.Hosts {
		if changes := before[h.Name].diff(sudoRules(t, h)); len(changes) > 0 {
			t.Errorf("host %s: /etc/sudoers.d changed: %s", h.Name, limit(changes, 20))
		}
	}
	noBuildUsersLeft(t)
}

// TestFloodingNamespaceDoesNotStarveAnother: one tenant queues many tasks on a platform with
// two slots; another tenant's single task gets a host before the flood's queue drains.
func TestFloodingNamespaceDoesNotStarveAnother(t *testing.T) {
	const slots, floodSize = 2, 30
	data := stack.StaticHostConfig(platform, slots)
	for _, h := range hostsByName()[1:] {
		data["host."+h.Name+".platform"] = "linux/ppc64le" // the flooded platform has one host
	}
	applyConfigData(t, data)
	defer applyConfig(t, 1, nil)
	flood, quiet := newTenant(t, "flood"), newTenant(t, "quiet")
	records := watchRecords(t)

	var floods []*pipelinev1.TaskRun
	for i := range floodSize {
		floods = append(floods, flood.create(t, flood.taskRun(fmt.Sprintf("f-%02d", i), platform)))
	}
	eventually(t, "the flood holds both slots and queues the rest", func() (bool, error) {
		ready, waiting := phases(t, flood.ns)
		return ready == slots && waiting == floodSize-slots, fmt.Errorf("%d ready, %d waiting; records: %s", ready, waiting, recordsOf(t, flood.ns))
	})

	floodWaitingWhenServed := -1
	lone := quiet.taskRun("lone", platform)
	records.mu.Lock()
	records.onChange = func(rec *berthv1.Allocation) {
		if floodWaitingWhenServed >= 0 || rec.Spec.TaskRun.Namespace != quiet.ns || rec.Status.Login == nil {
			return
		}
		// A task waits until it first holds a slot (with no record until then).
		floodWaitingWhenServed = floodSize - records.reserved[flood.ns]
	}
	records.mu.Unlock()
	quiet.create(t, lone)
	waiting(t, lone)

	// The flood's builds end one by one, as they get hosts, until the quiet tenant has one.
	finished := map[string]bool{}
	eventually(t, "the quiet tenant's task gets a host", func() (bool, error) {
		var list berthv1.AllocationList
		if err := admin().List(context.Background(), &list, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, rec := range list.Items {
			ref := rec.Spec.TaskRun
			if ref.Namespace == quiet.ns && handedOver(t, &rec) {
				return true, nil
			}
			if ref.Namespace == flood.ns && handedOver(t, &rec) && !finished[ref.Name] {
				finished[ref.Name] = true
				finish(t, &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}})
			}
		}
		return false, fmt.Errorf("%d of the flood's tasks finished", len(finished))
	})
	records.mu.Lock()
	waitingThen := floodWaitingWhenServed
	records.mu.Unlock()
	if waitingThen <= 0 {
		t.Errorf("the quiet tenant got a host only when the flood had %d tasks waiting (after %d of %d finished): it was starved", waitingThen, len(finished), floodSize)
	}
	t.Logf("the quiet tenant got a host with %d of the flood's tasks waiting, after %d finished", waitingThen, len(finished))

	finish(t, lone)
	for _, tr := range floods {
		finish(t, tr)
	}
	settled(t, flood.ns)
	settled(t, quiet.ns)
	records.verify(t, slots)
	noBuildUsersLeft(t)
}

// phases counts the namespace's tasks that have their build user and that wait for a slot.
func phases(t *testing.T, ns string) (ready, waiting int) {
	t.Helper()
	var trs pipelinev1.TaskRunList
	if err := admin().List(context.Background(), &trs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range trs.Items {
		handedOver, waits, err := stacktest.StateOf(context.Background(), admin(), &trs.Items[i])
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case handedOver:
			ready++
		case waits:
			waiting++
		}
	}
	return ready, waiting
}

// recordsOf describes berth's records of the namespace's tasks, for a failure message.
func recordsOf(t *testing.T, ns string) string {
	t.Helper()
	var list berthv1.AllocationList
	if err := admin().List(context.Background(), &list, client.InNamespace(devstack.Namespace)); err != nil {
		return err.Error()
	}
	var out []string
	for _, rec := range list.Items {
		if rec.Spec.TaskRun.Namespace != ns {
			continue
		}
		host := ""
		if rec.Status.Login != nil {
			host = rec.Status.Login.Host
		}
		out = append(out, fmt.Sprintf("%s %s host=%q attempt=%d failed=%v debts=%d message=%q",
			rec.Spec.TaskRun.Name, rec.Status.Phase, host, rec.Status.Attempt, rec.Status.FailedHosts, len(rec.Status.Debts), rec.Status.Message))
	}
	return strings.Join(out, "; ")
}
