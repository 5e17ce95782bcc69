//go:build stack

package taskrun_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// The build step of buildah-remote 0.10 with the OTP option, as the real task does it: redeem
// the token with curl against the CA of the secret, append a newline, ssh in with the key as
// the build user. Then the step redeems the token a second time, which must fail.
const otpBuild = `
set -e
mkdir -p ~/.ssh
if [ -e /ssh/error ]; then cat /ssh/error; exit 1; fi
if [ -e /ssh/id_rsa ]; then echo "the secret holds a key"; exit 1; fi
if ! /usr/bin/curl --fail --cacert /ssh/otp-ca -XPOST -d @/ssh/otp "$(cat /ssh/otp-server)" >~/.ssh/id_rsa; then
  echo "Failed to retrieve SSH key from the OTP server." >&2
  exit 1
fi
echo "" >> ~/.ssh/id_rsa
chmod 0400 ~/.ssh/id_rsa
ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 \
  "$(cat /ssh/host)" "cd $(cat /ssh/user-dir) && echo \"\$(id -un) \$(pwd)\"" > $(results.out.path)
again=$(/usr/bin/curl --silent --output /dev/null --write-out '%{http_code}' --cacert /ssh/otp-ca -XPOST -d @/ssh/otp "$(cat /ssh/otp-server)")
echo "second redemption: $again" >> $(results.out.path)
`

// With the OTP option the secret carries a one-time token and no key; the real task's curl
// redeems it once, and the key it gets logs in as the task's build user. When the task ends,
// nothing of the key is left kept.
func TestAOneTimeTokenRedeemsTheKeyOnce(t *testing.T) {
	url, ca := stacktest.OTPController(t, stack, controllerOptions())
	applyConfig(t, 2, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "build", platform, otpBuild))
	secret := secretOf(t, tr)
	if msg := secret.Data["error"]; len(msg) > 0 {
		t.Fatalf("error secret: %s", msg)
	}
	var keys []string
	for k := range secret.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"host", "otp", "otp-ca", "otp-server", "user-dir"}; !slices.Equal(keys, want) {
		t.Fatalf("the secret holds %v, want %v", keys, want)
	}
	if string(secret.Data["otp-server"]) != url || string(secret.Data["otp-ca"]) != string(ca.PEM) {
		t.Errorf("otp-server %q, otp-ca %q; want %q and the server's CA", secret.Data["otp-server"], secret.Data["otp-ca"], url)
	}

	eventually(t, "the build finishes", func() (bool, error) { return get(t, tr).IsDone(), nil })
	done := get(t, tr)
	if !done.IsSuccessful() {
		t.Fatalf("the build failed: %+v", done.Status.Conditions)
	}
	user := hostops.UserName(string(tr.UID), 1)
	if got, want := done.Status.Results[0].Value.StringVal, user+" /home/"+user+"/build\nsecond redemption: 404\n"; got != want {
		t.Fatalf("the build step wrote %q, want %q: the key logs in as the build user, once", got, want)
	}
	settled(t, ns)
	noKeysKept(t, tr)
}

// A token is worth nothing once its task's secret was changed or deleted by the tenant, or
// its task ended: the key is withdrawn, whoever read the token.
func TestATokenIsWorthNothingOnceItsSecretChangesOrItsTaskEnds(t *testing.T) {
	url, ca := stacktest.OTPController(t, stack, controllerOptions())
	applyConfig(t, 3, nil)
	ns := namespace(t)
	for _, c := range []struct {
		name string
		do   func(t *testing.T, tr *pipelinev1.TaskRun, s *corev1.Secret)
	}{
		{"edited", func(t *testing.T, _ *pipelinev1.TaskRun, s *corev1.Secret) {
			s.Data["host"] = []byte("root@" + strings.SplitN(string(s.Data["host"]), "@", 2)[1])
			if err := c().Update(context.Background(), s); err != nil {
				t.Fatal(err)
			}
		}},
		{"deleted", func(t *testing.T, _ *pipelinev1.TaskRun, s *corev1.Secret) {
			if err := c().Delete(context.Background(), s); err != nil {
				t.Fatal(err)
			}
		}},
		{"ended", func(t *testing.T, tr *pipelinev1.TaskRun, _ *corev1.Secret) { finish(t, tr) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := create(t, userTaskRun(ns, c.name, platform, ""))
			secret := secretOf(t, tr)
			token := string(secret.Data["otp"])
			if token == "" {
				t.Fatalf("the secret holds no token: %v", secret.Data)
			}
			c.do(t, tr, secret)
			eventually(t, "the key of "+tr.Name+" is withdrawn", func() (bool, error) {
				kept, err := keysOf(tr)
				return len(kept) == 0, err
			})
			status, body := redeem(t, url, ca, token)
			if status == http.StatusOK {
				t.Fatalf("the token of a task whose secret was %s still redeems its key", c.name)
			}
			if body != keyserver.ErrUnknown.Error() {
				t.Errorf("%d %q; want %q", status, body, keyserver.ErrUnknown)
			}
			finish(t, tr)
		})
	}
	settled(t, ns)
}

// redeem POSTs a token as a task would.
func redeem(t *testing.T, url string, ca *tlscerts.CA, token string) (int, string) {
	t.Helper()
	status, body, err := stacktest.Redeem(url, ca.PEM, token)
	if err != nil {
		t.Fatal(err)
	}
	return status, string(body)
}

// keysOf lists the keys kept for the task.
func keysOf(tr *pipelinev1.TaskRun) ([]corev1.Secret, error) {
	var list corev1.SecretList
	err := c().List(context.Background(), &list, client.InNamespace(devstack.Namespace),
		client.MatchingLabels{keyserver.KeyLabel: "true", keyserver.AllocationLabel: string(tr.UID)})
	return list.Items, err
}

func noKeysKept(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	kept, err := keysOf(tr)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) > 0 {
		t.Errorf("%d keys of %s are still kept after it ended", len(kept), tr.Name)
	}
}
