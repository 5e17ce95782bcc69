//go:build linux

package vmcloud

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

const testKey = "test-api-key"

func newAdmin(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testCloud(t *testing.T, bootDelay time.Duration) (*Cloud, ssh.Signer) {
	t.Helper()
	admin := newAdmin(t)
	return NewForTest(t, Options{Admin: admin, APIKey: testKey, BootDelay: bootDelay, Logf: t.Logf}), admin
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// answer is one API answer.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) instance(t *testing.T) wireInstance {
	t.Helper()
	var w wireInstance
	if err := json.Unmarshal(a.body, &w); err != nil {
		t.Fatalf("answer %d %s is not an instance: %v", a.status, a.body, err)
	}
	return w
}

func (a answer) code(t *testing.T) string {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(a.body, &e); err != nil || e.Code == "" || e.Message == "" {
		t.Fatalf("answer %d %s is not an API error: %v", a.status, a.body, err)
	}
	return e.Code
}

func call(t *testing.T, c *Cloud, key, method, path string, body any) answer {
	t.Helper()
	var r io.Reader
	if s, ok := body.(string); ok {
		r = strings.NewReader(s)
	} else if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(testContext(t), method, c.URL()+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: data}
}

func launch(t *testing.T, c *Cloud, token string, tags map[string]string) answer {
	t.Helper()
	return call(t, c, testKey, http.MethodPost, "/v1/instances", launchRequest{Token: token, Name: "vm-" + token, Tags: tags})
}

func list(t *testing.T, c *Cloud, query string) []string {
	t.Helper()
	a := call(t, c, testKey, http.MethodGet, "/v1/instances"+query, nil)
	if a.status != http.StatusOK {
		t.Fatalf("list%s: %d %s", query, a.status, a.body)
	}
	var l listAnswer
	if err := json.Unmarshal(a.body, &l); err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, inst := range l.Instances {
		ids = append(ids, inst.ID)
	}
	return ids
}

// login logs in to a VM as root the way berth would, from what the API says: address, port
// 22 and host key.
func login(ctx context.Context, w wireInstance, admin ssh.Signer) (string, error) {
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(w.HostKey))
	if err != nil {
		return "", fmt.Errorf("host key %q: %w", w.HostKey, err)
	}
	client, err := ssh.Dial("tcp", net.JoinHostPort(w.Address, "22"), &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(admin)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
		Timeout:         3 * time.Second,
	})
	if err != nil {
		return "", err
	}
	defer client.Close()
	stop := context.AfterFunc(ctx, func() { client.Close() })
	defer stop()
	session, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer session.Close()
	out, err := session.Output("hostname")
	return strings.TrimSpace(string(out)), err
}

func TestAPIRefusesWithoutTheKey(t *testing.T) {
	c, _ := testCloud(t, time.Hour)
	for _, key := range []string{"", "wrong"} {
		a := call(t, c, key, http.MethodGet, "/v1/instances", nil)
		if a.status != http.StatusUnauthorized || a.code(t) != codeUnauthorized {
			t.Errorf("key %q: %d %s, want 401 Unauthorized", key, a.status, a.body)
		}
		if a.header.Get("WWW-Authenticate") == "" {
			t.Errorf("key %q: a 401 without WWW-Authenticate", key)
		}
	}
	// A refused call takes nothing: not a launch, not an armed throttle.
	c.Throttle(1, time.Second)
	call(t, c, "wrong", http.MethodPost, "/v1/instances", launchRequest{Token: "t"})
	if n := c.LaunchCount(); n != 0 {
		t.Errorf("a refused call launched %d instances", n)
	}
	if a := call(t, c, testKey, http.MethodGet, "/v1/instances", nil); a.status != http.StatusTooManyRequests {
		t.Errorf("the throttle was used up by a refused call: %d %s", a.status, a.body)
	}
}

func TestLaunchIsIdempotentByToken(t *testing.T) {
	c, _ := testCloud(t, time.Hour) // they stay pending: no hosts needed here
	first := launch(t, c, "tok-1", map[string]string{"pool": "a"})
	if first.status != http.StatusCreated {
		t.Fatalf("launch: %d %s", first.status, first.body)
	}
	inst := first.instance(t)
	if inst.State != Pending || inst.ID == "" || inst.Token != "tok-1" || inst.Tags["pool"] != "a" {
		t.Fatalf("launched %+v", inst)
	}
	again := launch(t, c, "tok-1", map[string]string{"pool": "a"})
	if again.status != http.StatusOK || again.instance(t).ID != inst.ID {
		t.Fatalf("relaunch with the same token: %d %s, want 200 and %s", again.status, again.body, inst.ID)
	}
	if a := call(t, c, testKey, http.MethodDelete, "/v1/instances/"+inst.ID, nil); a.status != http.StatusOK || a.instance(t).State != Gone {
		t.Fatalf("terminate: %d %s", a.status, a.body)
	}
	// The token still names that instance, gone as it is: never a second one.
	gone := launch(t, c, "tok-1", nil)
	if gone.status != http.StatusOK || gone.instance(t).ID != inst.ID || gone.instance(t).State != Gone {
		t.Fatalf("launch with a gone instance's token: %d %s", gone.status, gone.body)
	}
	if n := c.LaunchCount(); n != 1 {
		t.Fatalf("LaunchCount %d, want 1", n)
	}
	all := c.Instances()
	if len(all) != 1 || all[0].TerminatedAt.IsZero() || all[0].Reason != "terminated" {
		t.Fatalf("Instances: %+v", all)
	}
}

func TestAPIErrors(t *testing.T) {
	c, _ := testCloud(t, time.Hour)

	for _, body := range []string{`{`, `{"name":"no token"}`, `{"token":"t","colour":"red"}`, `{"token":"t","tags":{"":"x"}}`} {
		if a := call(t, c, testKey, http.MethodPost, "/v1/instances", body); a.status != http.StatusBadRequest || a.code(t) != codeBadRequest {
			t.Errorf("launch %s: %d %s, want 400 BadRequest", body, a.status, a.body)
		}
	}
	if a := call(t, c, testKey, http.MethodGet, "/v1/instances?tag=novalue", nil); a.status != http.StatusBadRequest {
		t.Errorf("list with a bad filter: %d %s", a.status, a.body)
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		if a := call(t, c, testKey, method, "/v1/instances/vm-nosuch", nil); a.status != http.StatusNotFound || a.code(t) != codeNotFound {
			t.Errorf("%s unknown: %d %s, want 404 NotFound", method, a.status, a.body)
		}
	}

	c.FailLaunches(1)
	if a := launch(t, c, "cap", nil); a.status != http.StatusServiceUnavailable || a.code(t) != codeCapacity {
		t.Errorf("launch without capacity: %d %s, want 503", a.status, a.body)
	}
	// A refused launch does not take the token: the retry launches.
	if a := launch(t, c, "cap", nil); a.status != http.StatusCreated {
		t.Errorf("launch after the capacity error: %d %s", a.status, a.body)
	}

	c.SetQuota(1)
	if a := launch(t, c, "over", nil); a.status != http.StatusForbidden || a.code(t) != codeQuota {
		t.Errorf("launch over quota: %d %s, want 403 QuotaExceeded", a.status, a.body)
	}
	c.SetQuota(0)
	if a := launch(t, c, "over", nil); a.status != http.StatusCreated {
		t.Errorf("launch with no quota: %d %s", a.status, a.body)
	}

	c.Throttle(2, 1500*time.Millisecond)
	for i := range 2 {
		a := call(t, c, testKey, http.MethodGet, "/v1/instances", nil)
		if a.status != http.StatusTooManyRequests || a.code(t) != codeThrottled || a.header.Get("Retry-After") != "2" {
			t.Errorf("throttled call %d: %d Retry-After %q %s, want 429 and 2", i, a.status, a.header.Get("Retry-After"), a.body)
		}
	}
	if a := call(t, c, testKey, http.MethodGet, "/v1/instances", nil); a.status != http.StatusOK {
		t.Errorf("call after the throttle: %d %s", a.status, a.body)
	}
	if n := c.LaunchCount(); n != 2 {
		t.Errorf("LaunchCount %d, want 2", n)
	}
}

func TestListMatchesEveryTag(t *testing.T) {
	c, _ := testCloud(t, time.Hour)
	ids := map[string]string{}
	for token, tags := range map[string]map[string]string{
		"a1": {"platform": "a", "role": "build"},
		"a2": {"platform": "a", "role": "spare"},
		"b1": {"platform": "b", "role": "build"},
	} {
		ids[token] = launch(t, c, token, tags).instance(t).ID
	}
	call(t, c, testKey, http.MethodDelete, "/v1/instances/"+ids["a2"], nil)
	for query, want := range map[string][]string{
		"":                                {ids["a1"], ids["b1"]},
		"?tag=platform=a":                 {ids["a1"]},
		"?tag=role=build":                 {ids["a1"], ids["b1"]},
		"?tag=platform=b&tag=role=build":  {ids["b1"]},
		"?tag=platform=b&tag=role=spare":  {},
		"?tag=platform=a&tag=platform=b":  {},
		"?tag=" + "platform%3Da%3Dweird":  {},
		"?tag=role=build&tag=role=build":  {ids["a1"], ids["b1"]},
		"?tag=platform=a&tag=owner=nobod": {},
	} {
		got := list(t, c, query)
		if !sameSet(got, want) {
			t.Errorf("list%s = %v, want %v", query, got, want)
		}
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]bool{}
	for _, s := range a {
		seen[s] = true
	}
	for _, s := range b {
		if !seen[s] {
			return false
		}
	}
	return true
}

func TestFailedBootEndsGoneWithoutHost(t *testing.T) {
	c, _ := testCloud(t, 0)
	c.FailBoots(1)
	id := launch(t, c, "doomed", nil).instance(t).ID
	inst, err := c.WaitFor(testContext(t), id, Gone)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inst.Reason, "boot failed") || c.Host(id) != nil {
		t.Fatalf("after a failed boot: %+v, host %v", inst, c.Host(id))
	}
	if a := call(t, c, testKey, http.MethodGet, "/v1/instances/"+id, nil); a.status != http.StatusOK || a.instance(t).State != Gone || a.instance(t).StateReason == "" {
		t.Fatalf("get: %d %s, want the instance gone with a reason", a.status, a.body)
	}
	if ids := list(t, c, ""); len(ids) != 0 {
		t.Fatalf("list shows %v", ids)
	}
	// Waiting for it to run fails at once rather than at the deadline.
	if _, err := c.WaitFor(testContext(t), id, Running); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("WaitFor running on a failed boot: %v", err)
	}
}

// VMs are real hosts: they boot side by side, answer SSH with the admin key, and stop when
// terminated or lost.
func TestVMsBootInParallelAndEnd(t *testing.T) {
	c, admin := testCloud(t, 0)
	ctx := testContext(t)
	tokens := []string{"p1", "p2", "p3"}
	for _, tok := range tokens {
		if a := launch(t, c, tok, map[string]string{"burst": "yes"}); a.status != http.StatusCreated {
			t.Fatalf("launch %s: %d %s", tok, a.status, a.body)
		}
	}
	all := c.Instances()
	running := make([]wireInstance, len(all))
	addrs := map[string]bool{}
	for i, inst := range all {
		up, err := c.WaitFor(ctx, inst.ID, Running)
		if err != nil {
			t.Fatal(err)
		}
		if up.RunningAt.Before(up.LaunchedAt) {
			t.Errorf("%s: running at %s, launched at %s", inst.ID, up.RunningAt, up.LaunchedAt)
		}
		a := call(t, c, testKey, http.MethodGet, "/v1/instances/"+inst.ID, nil)
		running[i] = a.instance(t)
		if running[i].State != Running || running[i].Address == "" || running[i].HostKey == "" {
			t.Fatalf("running instance as the API shows it: %s", a.body)
		}
		addrs[running[i].Address] = true
		name, err := login(ctx, running[i], admin)
		if err != nil {
			t.Fatalf("%s: login: %v", inst.ID, err)
		}
		if name != c.Host(inst.ID).Name {
			t.Errorf("%s: logged in to %q, its host is %s", inst.ID, name, c.Host(inst.ID).Name)
		}
	}
	if len(addrs) != len(tokens) {
		t.Errorf("addresses %v, want %d distinct", addrs, len(tokens))
	}
	c.mu.Lock()
	peak := c.peakBooting
	c.mu.Unlock()
	t.Logf("%d hosts booted, at most %d at once", len(tokens), peak)
	if peak < 2 {
		t.Errorf("hosts booted one after another (at most %d at once)", peak)
	}

	// Terminated: gone, host down, and a second terminate is NotFound.
	a := call(t, c, testKey, http.MethodDelete, "/v1/instances/"+running[0].ID, nil)
	if a.status != http.StatusOK || a.instance(t).State != Gone {
		t.Fatalf("terminate: %d %s", a.status, a.body)
	}
	if _, err := login(ctx, running[0], admin); err == nil {
		t.Error("a terminated VM still lets root in")
	}
	if a := call(t, c, testKey, http.MethodDelete, "/v1/instances/"+running[0].ID, nil); a.status != http.StatusNotFound {
		t.Errorf("second terminate: %d %s, want 404", a.status, a.body)
	}

	// Vanished: as if the cloud never had it.
	if err := c.Vanish(running[1].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := login(ctx, running[1], admin); err == nil {
		t.Error("a vanished VM still lets root in")
	}
	if a := call(t, c, testKey, http.MethodGet, "/v1/instances/"+running[1].ID, nil); a.status != http.StatusNotFound {
		t.Errorf("get vanished: %d %s, want 404", a.status, a.body)
	}
	if got := list(t, c, "?tag=burst=yes"); !sameSet(got, []string{running[2].ID}) {
		t.Errorf("list after terminate and vanish: %v, want only %s", got, running[2].ID)
	}
	if inst, _ := c.Instance(running[1].ID); !inst.Vanished || inst.State != Gone {
		t.Errorf("Instances shows the vanished one as %+v", inst)
	}
	if _, err := login(ctx, running[2], admin); err != nil {
		t.Errorf("the VM left alone: %v", err)
	}
}

// ourSlots lists the host slots this process holds, from sshhosts' lock files.
func ourSlots(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob("/run/berth-testhosts/slot-*.lock")
	var ours []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(data), fmt.Sprintf("pid=%d\n", os.Getpid())) {
			ours = append(ours, f)
		}
	}
	return ours
}

func TestCloseStopsRunningAndBootingVMs(t *testing.T) {
	c, admin := testCloud(t, 0)
	ctx := testContext(t)
	id := launch(t, c, "up", nil).instance(t).ID
	if _, err := c.WaitFor(ctx, id, Running); err != nil {
		t.Fatal(err)
	}
	up := call(t, c, testKey, http.MethodGet, "/v1/instances/"+id, nil).instance(t)

	launch(t, c, "booting-1", nil)
	launch(t, c, "booting-2", nil)
	err := c.Wait(ctx, func([]Instance) (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.booting > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if slots := ourSlots(t); len(slots) > 0 {
		t.Errorf("hosts left after Close: %v", slots)
	}
	if _, err := login(ctx, up, admin); err == nil {
		t.Error("a VM still lets root in after Close")
	}
	for _, inst := range c.Instances() {
		if inst.State != Gone {
			t.Errorf("%s is %s after Close", inst.ID, inst.State)
		}
	}
}

// The Go face that the stand-ins of real clouds' APIs use, on a hostless cloud (no root or
// sshd needed).
func TestGoFaceHostless(t *testing.T) {
	c := NewForTest(t, Options{APIKey: "k", Hostless: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	inst, created, err := c.Launch("t1", "one", map[string]string{"a": "b"})
	if err != nil || !created {
		t.Fatalf("first launch: created=%v err=%v", created, err)
	}
	again, created, err := c.Launch("t1", "one", nil)
	if err != nil || created || again.ID != inst.ID {
		t.Fatalf("repeated launch: id %s (first %s) created=%v err=%v", again.ID, inst.ID, created, err)
	}
	up, err := c.WaitFor(ctx, inst.ID, Running)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(up.Address, "198.19.") || c.Host(inst.ID) != nil {
		t.Fatalf("hostless VM runs at %q with host %v; want a 198.19 address and no host", up.Address, c.Host(inst.ID))
	}
	c.SetQuota(1)
	if _, _, err := c.Launch("t2", "two", nil); !errors.Is(err, ErrQuota) {
		t.Fatalf("launch over quota: %v, want ErrQuota", err)
	}
	c.SetQuota(0)
	c.FailLaunches(1)
	if _, _, err := c.Launch("t3", "three", nil); !errors.Is(err, ErrCapacity) {
		t.Fatalf("launch with no capacity: %v, want ErrCapacity", err)
	}
	gone, err := c.Terminate(inst.ID)
	if err != nil || gone.State != Gone {
		t.Fatalf("terminate: %+v %v", gone, err)
	}
	if _, err := c.Terminate(inst.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second terminate: %v, want ErrNotFound", err)
	}
	if n := c.LaunchCount(); n != 1 {
		t.Fatalf("%d instances created, want 1", n)
	}
}

// A cloud with a default user boots VMs that let it in with the admin key and give it root
// through passwordless sudo, as an EC2 image's first boot does for ec2-user.
func TestDefaultUserIsAdminThroughSudo(t *testing.T) {
	admin := newAdmin(t)
	c := NewForTest(t, Options{Admin: admin, APIKey: testKey, DefaultUser: "ec2-user", Logf: t.Logf})
	inst, _, err := c.Launch("default-user", "du", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(testContext(t), inst.ID, Running); err != nil {
		t.Fatal(err)
	}
	out, err := c.Host(inst.ID).RunAs(testContext(t), "ec2-user", admin, "id -un; sudo -n id -u")
	if err != nil || out != "ec2-user\n0\n" {
		t.Fatalf("as ec2-user: %q, %v; want ec2-user reaching uid 0 through sudo", out, err)
	}
}
