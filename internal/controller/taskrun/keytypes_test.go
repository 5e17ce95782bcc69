//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/hostops"
)

// keyTypeLogins are, per user-key-type, the SSH key type the secret's id_rsa must hold and
// the signature algorithms a client may log in with: for RSA the SHA-2 ones only, since FIPS
// clients (and OpenSSH ≥ 8.8 by default) refuse ssh-rsa's SHA-1. wrong is an algorithm of
// another type, with which the login must fail: it shows the client really was held to one.
var keyTypeLogins = []struct {
	keyType    config.KeyType
	sshType    string
	algorithms []string
	wrong      string
}{
	{config.KeyTypeEd25519, ssh.KeyAlgoED25519, []string{ssh.KeyAlgoED25519}, ssh.KeyAlgoECDSA256},
	{config.KeyTypeECDSAP256, ssh.KeyAlgoECDSA256, []string{ssh.KeyAlgoECDSA256}, ssh.KeyAlgoED25519},
	{config.KeyTypeRSA3072, ssh.KeyAlgoRSA, []string{ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSASHA512}, ssh.KeyAlgoED25519},
}

// TestEveryKeyTypeLogsInWithOpenSSH: with each user-key-type in the ConfigMap, through either
// provisioner, a TaskRun's secret holds a key of that type in id_rsa, and OpenSSH's own client,
// allowed only that key's algorithm, logs in with it as the build user and works in user-dir.
func TestEveryKeyTypeLogsInWithOpenSSH(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatalf("this test needs OpenSSH's client: %v", err)
	}
	if len(keyTypeLogins) != len(config.KeyTypes) {
		t.Fatalf("the test knows %d key types, the config %d", len(keyTypeLogins), len(config.KeyTypes))
	}
	defer applyConfig(t, 2, nil)
	ns := namespace(t)
	for _, provisioner := range []string{"ssh", "taskrun"} {
		if provisioner != controllerOptions().Provisioner {
			o := controllerOptions()
			o.Provisioner = provisioner
			restartController(t, o)
			defer restartController(t, controllerOptions())
		}
		for _, kt := range keyTypeLogins {
			applyConfig(t, 2, map[string]string{"user-key-type": string(kt.keyType)})
			provisions := watchProvisions(t)
			tr := create(t, userTaskRun(ns, provisioner+"-"+string(kt.keyType), platform, ""))
			secret := secretOf(t, tr)
			what := fmt.Sprintf("%s through the %s provisioner", kt.keyType, provisioner)
			if provisioner == "taskrun" {
				// The public key went to the host as the provision TaskRun's param.
				var p *pipelinev1.TaskRun
				select {
				case ev := <-provisions.ResultChan():
					p = ev.Object.(*pipelinev1.TaskRun)
				case <-time.After(stacktest.Patience):
					t.Fatalf("%s: no provision TaskRun was seen", what)
				}
				var authorized string
				for _, param := range p.Spec.Params {
					if param.Name == "AUTHORIZED_KEY" {
						authorized = param.Value.StringVal
					}
				}
				if p.Labels[contract.UserTaskNameLabel] != tr.Name || !strings.HasPrefix(authorized, kt.sshType+" ") {
					t.Fatalf("%s: provision TaskRun for %q with AUTHORIZED_KEY %.40q", what, p.Labels[contract.UserTaskNameLabel], authorized)
				}
			}
			provisions.Stop()
			user := hostops.UserName(string(tr.UID), 1)
			if !strings.HasPrefix(string(secret.Data["host"]), user+"@") {
				t.Fatalf("%s: secret host %q, want %s@<address>; error: %s", what, secret.Data["host"], user, secret.Data["error"])
			}
			signer, err := ssh.ParsePrivateKey(secret.Data["id_rsa"])
			if err != nil {
				t.Fatalf("%s: id_rsa does not parse: %v", what, err)
			}
			if got := signer.PublicKey().Type(); got != kt.sshType {
				t.Fatalf("%s: id_rsa holds a %s key, want %s", what, got, kt.sshType)
			}
			keyFile := filepath.Join(t.TempDir(), "id_rsa")
			if err := os.WriteFile(keyFile, secret.Data["id_rsa"], 0o600); err != nil {
				t.Fatal(err)
			}
			dir := string(secret.Data["user-dir"])
			for _, alg := range kt.algorithms {
				out, err := openSSH(keyFile, alg, string(secret.Data["host"]), "cd "+dir+" && id -un && pwd")
				if want := user + "\n" + dir + "\n"; err != nil || out != want {
					t.Errorf("%s, signing with %s: ssh printed %q, want %q: %v", what, alg, out, want, err)
				}
			}
			if out, err := openSSH(keyFile, kt.wrong, string(secret.Data["host"]), "id -un"); err == nil {
				t.Errorf("%s: ssh allowed only %s logged in all the same (%q): the algorithm option proves nothing", what, kt.wrong, out)
			}
			finish(t, tr)
		}
		settled(t, ns)
	}
	noBuildUsersLeft(t)
}

// watchProvisions watches the provision TaskRuns in berth's namespace.
func watchProvisions(t *testing.T) watch.Interface {
	t.Helper()
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: stack.ControlPlane.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(context.Background(), &pipelinev1.TaskRunList{}, client.InNamespace(devstack.Namespace),
		client.MatchingLabels{contract.TaskTypeLabel: contract.TaskTypeProvision})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// openSSH runs command on host ("user@address") with OpenSSH's client, offering only keyFile and
// accepting only the public key signature algorithm alg, as a FIPS client configured for it would.
func openSSH(keyFile, alg, host, command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-i", keyFile,
		"-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes",
		"-o", "PreferredAuthentications=publickey", "-o", "PubkeyAcceptedAlgorithms="+alg,
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
		"-o", "LogLevel=ERROR", host, command)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
