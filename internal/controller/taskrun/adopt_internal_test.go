package taskrun

import (
	"slices"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostops"
)

// TestASecretWithoutOwnerIsAnsweredElsewhere: the secret the upstream controller's provision
// task writes (labelled, no owner) is its task's answer; berth's own, a stale one of an earlier
// TaskRun of the name and an unlabelled one are not.
func TestASecretWithoutOwnerIsAnsweredElsewhere(t *testing.T) {
	labelled := map[string]string{contract.SecretLabel: "true"}
	owner := func(uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "tekton.dev/v1", Kind: "TaskRun", Name: "left-behind", UID: types.UID(uid)}}
	}
	for _, tc := range []struct {
		name   string
		secret corev1.Secret
		want   bool
	}{
		{"the upstream provision task's", corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: labelled}}, true},
		{"berth's for this TaskRun", corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: labelled, OwnerReferences: owner("now")}}, false},
		{"berth's for an earlier TaskRun of the name", corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: labelled, OwnerReferences: owner("before")}}, false},
		{"unlabelled", corev1.Secret{}, false},
	} {
		if got := answeredElsewhere(&tc.secret); got != tc.want {
			t.Errorf("%s: answeredElsewhere = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestTaskRunsWhoseNamesRunTogetherShareNoAdoptedUser: two TaskRuns whose name and namespace
// concatenate to the same text got the same build user from the upstream controller, so both
// claim it; distinct names claim each of their users once.
func TestTaskRunsWhoseNamesRunTogetherShareNoAdoptedUser(t *testing.T) {
	tr := func(ns, name string) *pipelinev1.TaskRun {
		return &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	victim, lookalike, other := tr("team-ab", "build-1"), tr("m-ab", "build-1tea"), tr("team-ab", "build-2")
	claims := claimedBuildUsers([]*pipelinev1.TaskRun{victim, lookalike, other})
	for user, n := range claims {
		if want := hostops.UpstreamUserName("team-ab", "build-1"); (user == want) != (n == 2) || n > 2 {
			t.Errorf("%s claimed %d times; want twice only %s (of build-1 in team-ab and build-1tea in m-ab)", user, n, want)
		}
	}
}

// TestASecretAnsweredElsewhereIsToldOnce: a TaskRun whose secret the replaced controller wrote
// is left alone, and told so once, however many of its updates reach berth (Tekton writes its
// status several times a task); a new controller process tells it again, once.
func TestASecretAnsweredElsewhereIsToldOnce(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "host-a"), nil)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: contract.SecretPrefix + "build",
		Labels: map[string]string{contract.SecretLabel: "true"}}, Data: map[string][]byte{"host": []byte("u-1@10.0.0.9")}}
	if err := h.api.Create(h.ctx, secret); err != nil {
		t.Fatal(err)
	}
	h.create(userTaskRun("build", "linux/arm64"))
	for range 5 {
		h.enqueue("build")
		h.settle()
	}
	if got := h.events.on("TaskRun", tenantNS, "build", "ForeignSecret"); len(got) != 1 {
		t.Fatalf("%d ForeignSecret Events after 6 wake-ups, want 1: %v", len(got), got)
	}
	if recs := h.records(); len(recs) != 0 {
		t.Fatalf("berth took up a task another controller answered: %v", recs)
	}
	h.start()
	h.enqueue("build")
	h.settle()
	h.enqueue("build")
	h.settle()
	if got := h.events.on("TaskRun", tenantNS, "build", "ForeignSecret"); len(got) != 2 {
		t.Fatalf("%d ForeignSecret Events after a restart, want 2 (one per process)", len(got))
	}
}

// adoptedAs is the build user the TaskRun's record owes as adopted, "" when it was not adopted.
func (h *harness) adoptedAs(tr *pipelinev1.TaskRun) string {
	h.t.Helper()
	if rec := h.record(tr); rec != nil && rec.Status.Message == "adopted from the controller berth replaced" {
		return rec.Status.BuildUser
	}
	return ""
}

// leftByUpstream is a user TaskRun as the controller berth replaces leaves it on host: its host
// and platform labels and its finalizer, made before berth started (see create). Anything a
// tenant can write on its own TaskRun, and no more.
func leftByUpstream(name, host string) *pipelinev1.TaskRun {
	tr := userTaskRun(name, s390x)
	tr.Labels = map[string]string{contract.AssignedHostLabel: host, contract.TargetPlatformLabel: contract.PlatformLabelValue(s390x)}
	tr.Finalizers = []string{contract.Finalizer}
	return tr
}

// upstreamProvision is the provision TaskRun the upstream controller runs for a user TaskRun,
// as its launchProvisioningTask makes it: in its own namespace (ns), labelled as a provision,
// its params naming the TaskRun and the host's address and its admin login.
func upstreamProvision(ns, taskRun, address string) *pipelinev1.TaskRun {
	str := func(s string) pipelinev1.ParamValue { return *pipelinev1.NewStructuredValues(s) }
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: taskRun + "-prov-1a2b3", Labels: map[string]string{
			contract.TaskTypeLabel: contract.TaskTypeProvision, contract.UserTaskNamespaceLabel: tenantNS, contract.UserTaskNameLabel: taskRun}},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "provision-shared-host"}, Params: pipelinev1.Params{
			{Name: "SECRET_NAME", Value: str(contract.SecretPrefix + taskRun)}, {Name: "TASKRUN_NAME", Value: str(taskRun)},
			{Name: "NAMESPACE", Value: str(tenantNS)}, {Name: "HOST", Value: str(address)}, {Name: "USER", Value: str("root")},
		}},
	}
}

// TestALabelledTaskRunWithoutEvidenceTakesNoSlot: a TaskRun a tenant labelled with a host before
// berth's first start, with nothing the upstream controller made for it, is not adopted: it
// takes no slot from a task that controller really served there (whose provision TaskRun is
// still in that controller's namespace), waits as a new task, and is told why.
func TestALabelledTaskRunWithoutEvidenceTakesNoSlot(t *testing.T) {
	h := newHarness(t, hostsConfig(1, "host-a"), nil)
	// Named to come first in every list, so that it would take the one slot if labels sufficed.
	forged := h.create(leftByUpstream("a-forged", "host-a"))
	real := h.create(leftByUpstream("b-real", "host-a"))
	if err := h.api.Create(h.ctx, upstreamProvision(DefaultUpstreamNamespace, real.Name, addressOf(0))); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if got, want := h.adoptedAs(real), hostops.UpstreamUserName(tenantNS, real.Name); got != want {
		t.Errorf("the task the upstream controller served was adopted as %q, want %s", got, want)
	}
	if got := h.adoptedAs(forged); got != "" {
		t.Errorf("a TaskRun with only a tenant's labels was adopted as %s", got)
	}
	h.waiting(forged.Name)
	if got := h.events.on("TaskRun", tenantNS, forged.Name, "AdoptionUnproven"); len(got) != 1 {
		t.Errorf("%d AdoptionUnproven Events on the forged TaskRun, want 1", len(got))
	}
	if got := h.prov.Listed(); got != 1 {
		t.Errorf("the host's users were listed %d times, want once", got)
	}
	// Once the real task ends, its slot goes to the forged one, served as any new task.
	h.finish(real.Name)
	h.settle()
	if user, _ := h.handedOver(h.get(forged.Name)); user != hostops.UserName(string(forged.UID), 1) {
		t.Errorf("the forged TaskRun got %s, want a fresh user", user)
	}
}

// TestOnlyTheUpstreamControllersOwnStateProvesAdoption: a provision TaskRun in the upstream
// controller's namespace, or the TaskRun's build user on the host, proves that the task was
// served there, and names the user; a provision TaskRun a tenant made in its own namespace, a
// user on another host, or one of a name another TaskRun's does not.
func TestOnlyTheUpstreamControllersOwnStateProvesAdoption(t *testing.T) {
	h := newHarness(t, hostsConfig(6, "host-a", "host-b"), nil) // room for every candidate
	byProvision := h.create(leftByUpstream("by-provision", "host-a"))
	byUpstreamUser := h.create(leftByUpstream("by-upstream-user", "host-a"))
	byLegacyUser := h.create(leftByUpstream("by-legacy-user", "host-a"))
	tenantProvision := h.create(leftByUpstream("tenant-provision", "host-a"))
	otherHost := h.create(leftByUpstream("user-on-other-host", "host-a"))
	wrongAddress := h.create(leftByUpstream("provision-elsewhere", "host-a"))
	for _, p := range []*pipelinev1.TaskRun{
		upstreamProvision(DefaultUpstreamNamespace, byProvision.Name, addressOf(0)),
		upstreamProvision(tenantNS, tenantProvision.Name, addressOf(0)),
		upstreamProvision(DefaultUpstreamNamespace, wrongAddress.Name, addressOf(1)),
	} {
		if err := h.api.Create(h.ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	h.prov.Put("host-a", hostops.UpstreamUserName(tenantNS, byUpstreamUser.Name))
	h.prov.Put("host-a", hostops.LegacyUserName(tenantNS, byLegacyUser.Name))
	h.prov.Put("host-b", hostops.UpstreamUserName(tenantNS, otherHost.Name))
	h.settle()
	for _, tc := range []struct {
		tr   *pipelinev1.TaskRun
		want string
	}{
		{byProvision, hostops.UpstreamUserName(tenantNS, byProvision.Name)},
		{byUpstreamUser, hostops.UpstreamUserName(tenantNS, byUpstreamUser.Name)},
		{byLegacyUser, hostops.LegacyUserName(tenantNS, byLegacyUser.Name)},
		{tenantProvision, ""},
		{otherHost, ""},
		{wrongAddress, ""},
	} {
		if got := h.adoptedAs(tc.tr); got != tc.want {
			t.Errorf("%s: adopted as %q, want %q", tc.tr.Name, got, tc.want)
		}
		if tc.want == "" && len(h.events.on("TaskRun", tenantNS, tc.tr.Name, "AdoptionUnproven")) != 1 {
			t.Errorf("%s: not told once why it was not adopted", tc.tr.Name)
		}
	}
	if got := h.prov.Listed(); got != 1 {
		t.Errorf("host-a's users were listed %d times, want once", got)
	}
}

// TestALegacyNameCollisionIsRefused: an earlier berth release named a build user by 48 bits of a
// hash of the TaskRun's namespace and name, few enough to find two names that share one (the
// pair below took a few minutes of one core, by Floyd's cycle search). With that user on the
// host, neither TaskRun is adopted, though their upstream names differ: berth cannot tell
// whose user it is, and adopting either would let its clean end the other's build.
func TestALegacyNameCollisionIsRefused(t *testing.T) {
	h := newHarness(t, hostsConfig(2, "host-a"), nil)
	victim, lookalike := h.create(leftByUpstream("build-588014360568", "host-a")), h.create(leftByUpstream("build-2f13714c1775", "host-a"))
	legacy := hostops.LegacyUserName(tenantNS, victim.Name)
	if hostops.LegacyUserName(tenantNS, lookalike.Name) != legacy || hostops.UpstreamUserName(tenantNS, lookalike.Name) == hostops.UpstreamUserName(tenantNS, victim.Name) {
		t.Fatal("the pair's legacy names differ, or their upstream names do not: the test names them wrong")
	}
	h.prov.Put("host-a", legacy)
	h.settle()
	for _, tr := range []*pipelinev1.TaskRun{victim, lookalike} {
		if got := h.adoptedAs(tr); got != "" {
			t.Errorf("%s was adopted as %s, a user another TaskRun's name gives too", tr.Name, got)
		}
		if got := h.events.on("TaskRun", tenantNS, tr.Name, "AdoptionFailed"); len(got) != 1 {
			t.Errorf("%s: %d AdoptionFailed Events, want 1", tr.Name, len(got))
		}
	}
	if users := h.prov.Users("host-a"); !slices.Contains(users, legacy) {
		t.Errorf("berth removed %s, the user both TaskRuns' names give (users left: %v)", legacy, users)
	}
}
