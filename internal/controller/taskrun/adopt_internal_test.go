package taskrun

import (
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostops"
)

// TestAdoptedBuildUserIsTheOneThatWasMade: a TaskRun adopted at the switch-over owes the user
// the upstream controller made for it, unless its secret logs in as the user an earlier berth
// release made; nothing else a secret says names the user.
func TestAdoptedBuildUserIsTheOneThatWasMade(t *testing.T) {
	tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: "builds", Name: "left-behind"}}
	upstream, legacy := hostops.UpstreamUserName("builds", "left-behind"), hostops.LegacyUserName("builds", "left-behind")
	other := hostops.UpstreamUserName("builds", "someone-else")
	for _, tc := range []struct {
		name string
		data map[string][]byte
		want string
	}{
		{"no secret yet (the upstream provision still running)", nil, upstream},
		{"the upstream controller's secret", map[string][]byte{"host": []byte(upstream + "@10.0.0.1")}, upstream},
		{"an earlier berth's secret", map[string][]byte{"host": []byte(legacy + "@10.0.0.1")}, legacy},
		{"a secret naming another task's user", map[string][]byte{"host": []byte(other + "@10.0.0.1")}, upstream},
		{"a one-time-password secret of an earlier berth", map[string][]byte{"otp": []byte("t"), "host": []byte(legacy + "@h")}, legacy},
	} {
		if got := adoptedBuildUser(tr, tc.data); got != tc.want {
			t.Errorf("%s: adopted as %s, want %s", tc.name, got, tc.want)
		}
	}
}

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
// concatenate to the same text got the same build user from the upstream controller, so
// adoption must not own it for either; distinct names share nothing.
func TestTaskRunsWhoseNamesRunTogetherShareNoAdoptedUser(t *testing.T) {
	tr := func(ns, name string) *pipelinev1.TaskRun {
		return &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	victim, lookalike, other := tr("team-ab", "build-1"), tr("m-ab", "build-1tea"), tr("team-ab", "build-2")
	shared := sharedUpstreamUsers([]*pipelinev1.TaskRun{victim, lookalike, other})
	if want := hostops.UpstreamUserName("team-ab", "build-1"); len(shared) != 1 || !shared[want] {
		t.Errorf("shared users %v, want only %s (of build-1 in team-ab and build-1tea in m-ab)", shared, want)
	}
	if shared := sharedUpstreamUsers([]*pipelinev1.TaskRun{victim, other}); len(shared) != 0 {
		t.Errorf("distinct TaskRuns share users %v", shared)
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
