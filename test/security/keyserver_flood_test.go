package security_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/otp"
)

// keyAuditLog is the apiserver's record of every request for a Secret of berth's namespace,
// where the kept keys are: each names the Secret it asked for, so it shows whether a token's
// key was ever looked up.
var keyAuditLog string

// auditKeys has the stack's apiserver write keyAuditLog (the stack's shape, in TestMain).
func auditKeys(o *devstack.Options) {
	keyAuditLog = filepath.Join(o.StateDir, "audit", "keys.log")
	o.ControlPlane = append(o.ControlPlane, controlplane.WithAuditPolicy(keyAuditLog, auditv1.PolicyRule{
		Level:      auditv1.LevelMetadata,
		Resources:  []auditv1.GroupResources{{Group: "", Resources: []string{"secrets"}}},
		Namespaces: []string{devstack.Namespace},
	}))
}

// The real buildah-remote step with the OTP option, then a second redemption that must fail.
const floodedBuild = `
set -e
mkdir -p ~/.ssh
if [ -e /ssh/error ]; then cat /ssh/error; exit 1; fi
/usr/bin/curl --fail --silent --show-error --cacert /ssh/otp-ca -XPOST -d @/ssh/otp "$(cat /ssh/otp-server)" >~/.ssh/id_rsa
echo "" >> ~/.ssh/id_rsa
chmod 0400 ~/.ssh/id_rsa
ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 \
  "$(cat /ssh/host)" "cd $(cat /ssh/user-dir) && echo \"\$(id -un) \$(pwd)\"" > $(results.out.path)
again=$(/usr/bin/curl --silent --output /dev/null --write-out '%{http_code}' --cacert /ssh/otp-ca -XPOST -d @/ssh/otp "$(cat /ssh/otp-server)")
echo "second redemption: $again" >> $(results.out.path)
`

// Flood sizes: the 10,000 random tokens from 50 clients at once, kept up until every
// real task is done so that each of them redeems under it; the cap bounds the run.
const (
	floodTokens  = 10000
	floodClients = 50
	floodCap     = 200000
	realTasks    = 6
)

// A tenant whose pod floods the key server with random tokens from its own address slows no
// other tenant's task and costs the apiserver nothing: every real task redeems its key, and
// the apiserver was never asked about a single token of the flood.
func TestKeyServerHoldsUnderAFlood(t *testing.T) {
	flooder := hostsByName()[0]
	// This machine's end of the flooder's link: where its network namespace reaches us.
	here := fmt.Sprintf("198.18.%d.1", flooder.Slot)
	url, ca := stacktest.OTPControllerOn(t, stack, controllerOptions(), "", here)
	floodURL := strings.Replace(url, "127.0.0.1", here, 1)
	applyConfig(t, 2, nil)
	tn := newTenant(t, "")

	var tasksDone atomic.Bool
	flood := startFlood(t, flooder.Name, floodURL, ca, &tasksDone)

	// The first task is one Tekton may retry (a pipeline task with retries: 2): its key is
	// kept after its redemption, for the next attempt, and its second redemption is a replay
	// in the attempt that redeemed it.
	var trs []*pipelinev1.TaskRun
	for i := range realTasks {
		tr := floodedTaskRun(tn.ns, fmt.Sprintf("build-%d", i))
		if i == 0 {
			tr.Spec.Retries = 2
		}
		trs = append(trs, tn.create(t, tr))
	}
	retried := ""
	realNames := map[string]string{}
	for _, tr := range trs {
		secret := secretOf(t, tr)
		if msg := secret.Data["error"]; len(msg) > 0 {
			t.Fatalf("%s got an error secret: %s", tr.Name, msg)
		}
		tok, err := otp.ParseToken(string(secret.Data["otp"]))
		if err != nil {
			t.Fatalf("%s: the secret's token: %v", tr.Name, err)
		}
		realNames[tok.Name()] = tr.Name
		if tr.Spec.Retries > 0 {
			retried = tok.Name()
		}
	}
	for _, tr := range trs {
		eventually(t, tr.Name+" finishes", func() (bool, error) { return get(t, tr).IsDone(), nil })
	}
	tasksDone.Store(true)
	sent := flood.wait(t)

	for _, tr := range trs {
		done := get(t, tr)
		if !done.IsSuccessful() {
			t.Errorf("%s failed under the flood: %+v", tr.Name, done.Status.Conditions)
			continue
		}
		user := hostops.UserName(string(tr.UID), 1)
		if got, want := done.Status.Results[0].Value.StringVal, user+" /home/"+user+"/build\nsecond redemption: 404\n"; got != want {
			t.Errorf("%s wrote %q, want %q: its key logs in as its build user, once", tr.Name, got, want)
		}
	}
	flood.report(t)
	if flood.during.Load() == 0 {
		t.Fatal("no flood request was answered while the real tasks ran")
	}

	// The audit log names every Secret asked for: the real keys' are there (so a lookup of a
	// flood token would be too), the flood's are not.
	floodNames := make(map[string]bool, len(sent))
	for _, tok := range sent {
		floodNames[tok.Name()] = true
	}
	// The retried task's key is claimed by an update and kept; the replay after it must be
	// refused from memory: no read of that key between the claim and its deletion at the
	// task's end.
	seen := map[string]bool{}
	var asked []string
	claimed, everClaimed, replayReads := false, false, 0
	if err := controlplane.ReadAuditLog(keyAuditLog, func(ev *auditv1.Event) {
		ref := ev.ObjectRef
		if ref == nil || ref.Resource != "secrets" || ref.Namespace != devstack.Namespace {
			return
		}
		if floodNames[ref.Name] {
			asked = append(asked, ev.Verb+" "+ref.Name+" by "+ev.User.Username)
		}
		if _, ok := realNames[ref.Name]; ok && ev.Verb == "get" {
			seen[ref.Name] = true
		}
		if ref.Name == retried && ev.Stage == auditv1.StageResponseComplete {
			switch {
			case ev.Verb == "update":
				claimed, everClaimed = true, true
			case ev.Verb == "delete":
				claimed = false
			case ev.Verb == "get" && claimed:
				replayReads++
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(asked) > 0 {
		t.Errorf("the apiserver was asked %d times about the flood's tokens, e.g. %s", len(asked), asked[0])
	}
	if !everClaimed {
		t.Error("the retried task's key was never claimed by an update: it was not kept for a next attempt, so its replay proves nothing")
	}
	if replayReads > 0 {
		t.Errorf("the retried task's replay in the attempt that redeemed its key cost %d reads of the key", replayReads)
	}
	for name, task := range realNames {
		if !seen[name] {
			t.Errorf("the audit log has no read of %s's key %s: it would not show a lookup of the flood's tokens either", task, name)
		}
	}
	settled(t, tn.ns)
}

func floodedTaskRun(ns, name string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{stacktest.RunScriptKey: "true"}},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Results: []pipelinev1.TaskResult{{Name: "out"}},
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: floodedBuild,
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name}}}},
			},
		},
	}
}

// flood is floodClients clients in a test host's network namespace POSTing random tokens.
type flood struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	sent    []otp.Token
	answers map[int]int
	errs    []error
	// noRetryAfter counts 429s without Retry-After; during counts answers given while real
	// tasks were still running.
	noRetryAfter, during atomic.Int64
}

func startFlood(t *testing.T, netns, url string, ca *tlscerts.CA, tasksDone *atomic.Bool) *flood {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:         dialIn(netns),
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: floodClients,
	}}
	f := &flood{answers: map[int]int{}}
	var count atomic.Int64
	deadline := time.Now().Add(3 * stacktest.Patience)
	for range floodClients {
		f.wg.Go(func() {
			for {
				n := count.Add(1)
				if n > floodCap || (n > floodTokens && tasksDone.Load()) || time.Now().After(deadline) {
					return
				}
				tok := otp.NewToken()
				status, retry, err := post(hc, url, tok.String())
				f.mu.Lock()
				f.sent = append(f.sent, tok)
				if err != nil {
					f.errs = append(f.errs, err)
				} else {
					f.answers[status]++
				}
				f.mu.Unlock()
				if status == http.StatusTooManyRequests && retry == "" {
					f.noRetryAfter.Add(1)
				}
				if !tasksDone.Load() {
					f.during.Add(1)
				}
			}
		})
	}
	t.Cleanup(func() { f.wg.Wait(); hc.CloseIdleConnections() })
	return f
}

// wait waits for the flood to end and returns every token it sent.
func (f *flood) wait(t *testing.T) []otp.Token {
	t.Helper()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 {
		t.Fatalf("%d flood requests failed, e.g. %v", len(f.errs), f.errs[0])
	}
	if len(f.sent) < floodTokens {
		t.Fatalf("the flood sent %d tokens, want at least %d", len(f.sent), floodTokens)
	}
	return f.sent
}

// report checks what the flood was told: never a key, and a Retry-After with every 429.
func (f *flood) report(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("flood of %d tokens from %d clients, %d while real tasks ran: answers %v", len(f.sent), floodClients, f.during.Load(), f.answers)
	for status, n := range f.answers {
		if status != http.StatusNotFound && status != http.StatusTooManyRequests {
			t.Errorf("%d flood requests answered %d; want only 404 (unknown) and 429 (too many)", n, status)
		}
	}
	if f.answers[http.StatusTooManyRequests] == 0 {
		t.Error("no flood request was answered 429: the per-source limits never held it back")
	}
	if n := f.noRetryAfter.Load(); n > 0 {
		t.Errorf("%d answers 429 without Retry-After", n)
	}
}

func post(hc *http.Client, url, body string) (status int, retryAfter string, err error) {
	resp, err := hc.Post(url, "application/x-www-form-urlencoded", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), err
}

// dialIn dials from network namespace netns (a test host's, made by `ip netns add`), so that
// a connection's source is the host's address, as a pod's would be its own.
func dialIn(netns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type dialed struct {
			c   net.Conn
			err error
		}
		done := make(chan dialed, 1)
		go func() {
			// The thread enters the namespace and goes back to this process's before it is
			// handed back. Were it left there, the runtime would end it with this goroutine,
			// unless it is the main thread, which the runtime never ends: parked in the host's
			// namespace, it would make this process one of the host's, and the host's Close,
			// which kills every process in its namespace, would kill the test binary.
			runtime.LockOSThread()
			home, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				done <- dialed{err: err}
				return
			}
			defer home.Close()
			defer func() {
				if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
					runtime.UnlockOSThread()
				}
			}()
			ns, err := os.Open(filepath.Join("/run/netns", netns))
			if err != nil {
				done <- dialed{err: err}
				return
			}
			defer ns.Close()
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				done <- dialed{err: fmt.Errorf("entering network namespace %s: %w", netns, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			done <- dialed{c, err}
		}()
		r := <-done
		return r.c, r.err
	}
}
