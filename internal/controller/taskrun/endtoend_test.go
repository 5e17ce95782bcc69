//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostops"
)

// A remote build as buildah-remote does it: read the secret, ssh in as the per-task user,
// work in user-dir.
const remoteBuild = `
if [ -e /ssh/error ]; then cat /ssh/error; exit 1; fi
key=$(mktemp); trap 'rm -f "$key"' EXIT
cp /ssh/id_rsa "$key"; chmod 600 "$key"
ssh -i "$key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 \
  "$(cat /ssh/host)" "cd $(cat /ssh/user-dir) && echo \"\$(id -un) \$(pwd)\"" > $(results.out.path)
`

func TestARemoteBuildRunsAsAFreshUserThatIsRemovedAfter(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "build", platform, remoteBuild))
	secret := secretOf(t, tr)
	user := hostops.UserName(string(tr.UID), 1)
	host := strings.TrimPrefix(string(secret.Data["host"]), user+"@")
	if !strings.HasPrefix(string(secret.Data["host"]), user+"@") {
		t.Fatalf("secret host %q, want %s@<address>; error: %s", secret.Data["host"], user, secret.Data["error"])
	}
	eventually(t, "the build finishes", func() (bool, error) { return get(t, tr).IsDone(), nil })
	done := get(t, tr)
	if !done.IsSuccessful() {
		t.Fatalf("the remote build failed: %+v", done.Status.Conditions)
	}
	if got := done.Status.Results[0].Value.StringVal; got != user+" /home/"+user+"/build\n" {
		t.Fatalf("the build ran as %q, want the per-task user in its user-dir", got)
	}
	if done.Labels[contract.TargetPlatformLabel] != "linux-s390x" {
		t.Errorf("target-platform label %q", done.Labels[contract.TargetPlatformLabel])
	}
	settled(t, ns)
	noBuildUsersLeft(t)
	for _, h := range stack.Fleet.Hosts {
		if h.Address == host {
			return
		}
	}
	t.Fatalf("the secret names %s, not one of the configured hosts", host)
}

func TestALocalPlatformsTaskIsToldLocalhost(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "native", "linux/amd64", ""))
	secret := secretOf(t, tr)
	if string(secret.Data["host"]) != "localhost" || len(secret.Data) != 1 {
		t.Fatalf("local secret %v", secret.Data)
	}
	// The label is a mirror, patched after the secret is written.
	eventually(t, "the TaskRun is labelled as served locally", func() (bool, error) {
		got := get(t, tr).Labels[contract.AssignedHostLabel]
		return got == contract.Localhost, fmt.Errorf("assigned-host %q", got)
	})
	if err := stack.StandIn.Finish(context.Background(), keyOf(tr), nil); err != nil {
		t.Fatal(err)
	}
	settled(t, ns)
}

// TestInternalTaskRunsMakeAndRemoveTheUserWithoutSeeingTheKey: with --provisioner=taskrun the build user is made by a
// provision TaskRun in berth's namespace (run by the stand-in with berth's own step, as the
// host-tasks ServiceAccount), which never sees the private key; the controller writes the
// secret, and a clean TaskRun removes the user.
func TestInternalTaskRunsMakeAndRemoveTheUserWithoutSeeingTheKey(t *testing.T) {
	o := controllerOptions()
	o.Provisioner = "taskrun"
	restartController(t, o)
	defer restartController(t, controllerOptions())
	applyConfig(t, 2, nil)
	ns := namespace(t)
	w := watchProvisions(t)
	tr := create(t, userTaskRun(ns, "build", platform, remoteBuild))
	user := hostops.UserName(string(tr.UID), 1)
	if secret := secretOf(t, tr); !strings.HasPrefix(string(secret.Data["host"]), user+"@") {
		t.Fatalf("secret host %q, want %s@<address>; error: %s", secret.Data["host"], user, secret.Data["error"])
	}
	provision := (<-w.ResultChan()).Object.(*pipelinev1.TaskRun)
	if provision.Labels[contract.UserTaskNameLabel] != tr.Name {
		t.Fatalf("the first provision TaskRun serves %q", provision.Labels[contract.UserTaskNameLabel])
	}
	for _, p := range provision.Spec.Params {
		if strings.Contains(p.Value.StringVal, "PRIVATE KEY") {
			t.Fatalf("param %s of the provision TaskRun carries a private key", p.Name)
		}
	}
	eventually(t, "the build finishes", func() (bool, error) { return get(t, tr).IsDone(), nil })
	if done := get(t, tr); !done.IsSuccessful() || done.Status.Results[0].Value.StringVal != user+" /home/"+user+"/build\n" {
		t.Fatalf("the remote build: %+v %+v", done.Status.Conditions, done.Status.Results)
	}
	settled(t, ns)
	noBuildUsersLeft(t)
}
