//go:build linux

package localvm_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/cloudfake"
	_ "github.com/berth-ci/berth/internal/dev/localvm"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

const (
	apiKey     = "the-right-key"
	secretName = "local-vm-cloud"
)

// secrets stands in for the controller's namespace.
type secrets = cloudfake.Secrets

func goodSecrets() secrets {
	return secrets{secretName: {"api-key": []byte(apiKey + "\n")}}
}

func newProvider(t *testing.T, endpoint string, s secrets) cloud.Provider {
	t.Helper()
	p, err := cloud.New("local-vm", cloud.Settings{
		Platform: "linux-local",
		Values:   map[string]string{"endpoint": endpoint, "secret": secretName},
		Secret:   s.Read,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setup starts a cloud and a provider pointed at it.
func setup(t *testing.T, bootDelay time.Duration) (*vmcloud.Cloud, cloud.Provider, ssh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	c := vmcloud.NewForTest(t, vmcloud.Options{Admin: admin, APIKey: apiKey, BootDelay: bootDelay, Logf: t.Logf})
	return c, newProvider(t, c.URL(), goodSecrets()), admin
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// runAsAdmin logs in to a VM as the provider's admin user, at the address the provider
// reported, and runs command.
func runAsAdmin(ctx context.Context, p cloud.Provider, addr string, hostKey ssh.PublicKey, admin ssh.Signer, command string) (string, error) {
	client, err := ssh.Dial("tcp", net.JoinHostPort(addr, "22"), &ssh.ClientConfig{
		User:            p.AdminUser(),
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
	out, err := session.Output(command)
	return strings.TrimSpace(string(out)), err
}

func ids(insts []cloud.Instance) []string {
	out := []string{}
	for _, inst := range insts {
		out = append(out, inst.ID)
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func wantKind(t *testing.T, what string, err error, kind cloud.Kind) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %s", what, kind)
	}
	if got := cloud.KindOf(err); got != kind {
		t.Fatalf("%s: kind %s (%v), want %s", what, got, err, kind)
	}
}

func TestLaunchLoginListTerminate(t *testing.T) {
	c, p, admin := setup(t, 0)
	ctx := testContext(t)

	tagsA := map[string]string{"berth/platform": "linux-local", "berth/pool": "a"}
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "tok-a", Name: "berth-a", Tags: tagsA})
	if err != nil {
		t.Fatal(err)
	}
	if inst.ID == "" || inst.Token != "tok-a" || inst.State == cloud.StateGone || inst.Tags["berth/pool"] != "a" || inst.LaunchedAt.IsZero() {
		t.Fatalf("launched %+v", inst)
	}
	if _, err := c.WaitFor(ctx, inst.ID, vmcloud.Running); err != nil {
		t.Fatal(err)
	}
	running, err := p.Get(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if running.State != cloud.StateRunning || running.Address == "" {
		t.Fatalf("running instance: %+v", running)
	}
	vm, _ := c.Instance(inst.ID)
	if out, err := runAsAdmin(ctx, p, running.Address, vm.HostKey, admin, "id -u"); err != nil || out != "0" {
		t.Fatalf("root on the VM: %q, %v", out, err)
	}

	// The same token is the same VM, however often berth asks.
	again, err := p.Launch(ctx, cloud.LaunchRequest{Token: "tok-a", Name: "berth-a", Tags: tagsA})
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != inst.ID || again.State != cloud.StateRunning {
		t.Fatalf("relaunch: %+v, want %s running", again, inst.ID)
	}
	if n := c.LaunchCount(); n != 1 {
		t.Fatalf("LaunchCount %d after two launches with one token", n)
	}

	// A second one that stays pending (no host needed) to list against.
	c.SetBootDelay(time.Hour)
	b, err := p.Launch(ctx, cloud.LaunchRequest{Token: "tok-b", Name: "berth-b", Tags: map[string]string{"berth/platform": "linux-local", "berth/pool": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.State != cloud.StatePending {
		t.Fatalf("launched %+v, want pending", b)
	}
	for _, tc := range []struct {
		tags map[string]string
		want []string
	}{
		{nil, sorted(inst.ID, b.ID)},
		{map[string]string{"berth/platform": "linux-local"}, sorted(inst.ID, b.ID)},
		{map[string]string{"berth/pool": "a"}, []string{inst.ID}},
		{map[string]string{"berth/platform": "linux-local", "berth/pool": "b"}, []string{b.ID}},
		{map[string]string{"berth/pool": "a", "other": "x"}, []string{}},
	} {
		got, err := p.List(ctx, tc.tags)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("List(%v) = %v, want %v", tc.tags, ids(got), tc.want)
		}
	}

	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if gone, err := p.Get(ctx, inst.ID); err != nil || gone.State != cloud.StateGone {
		t.Fatalf("after terminate: %+v, %v", gone, err)
	}
	if _, err := runAsAdmin(ctx, p, running.Address, vm.HostKey, admin, "true"); err == nil {
		t.Fatal("the terminated VM still lets root in")
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("terminating a gone instance: %v", err)
	}
	if got, err := p.List(ctx, nil); err != nil || !slices.Equal(ids(got), []string{b.ID}) {
		t.Fatalf("List after terminate: %v, %v", ids(got), err)
	}
	if err := p.Terminate(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, "vm-nosuch"); err != nil {
		t.Fatalf("terminating an unknown instance: %v", err)
	}
	if _, err := p.Get(ctx, "vm-nosuch"); cloud.KindOf(err) != cloud.NotFound {
		t.Fatalf("get unknown: %v, want NotFound", err)
	}
}

func TestVanishedInstanceIsNotFound(t *testing.T) {
	c, p, admin := setup(t, 0)
	ctx := testContext(t)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "lost", Tags: map[string]string{"pool": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := c.WaitFor(ctx, inst.ID, vmcloud.Running)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Vanish(inst.ID); err != nil {
		t.Fatal(err)
	}
	_, err = p.Get(ctx, inst.ID)
	wantKind(t, "get a vanished instance", err, cloud.NotFound)
	if got, err := p.List(ctx, map[string]string{"pool": "x"}); err != nil || len(got) != 0 {
		t.Fatalf("List shows %v, %v", ids(got), err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("terminating a vanished instance: %v", err)
	}
	if _, err := runAsAdmin(ctx, p, vm.Address, vm.HostKey, admin, "true"); err == nil {
		t.Fatal("the vanished VM still lets root in")
	}
}

// Each fault of the cloud reaches berth as the kind of error that tells it what to do. None
// of these boots a host.
func TestFaultsMapToKinds(t *testing.T) {
	c, p, _ := setup(t, time.Hour)
	ctx := testContext(t)

	t.Run("capacity", func(t *testing.T) {
		c.FailLaunches(1)
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "cap"})
		wantKind(t, "launch without capacity", err, cloud.Capacity)
		if n := c.LaunchCount(); n != 0 {
			t.Fatalf("LaunchCount %d after a capacity error", n)
		}
	})

	t.Run("quota", func(t *testing.T) {
		c.SetQuota(1)
		defer c.SetQuota(0)
		first, err := p.Launch(ctx, cloud.LaunchRequest{Token: "q1"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Terminate(ctx, first.ID)
		_, err = p.Launch(ctx, cloud.LaunchRequest{Token: "q2"})
		wantKind(t, "launch over quota", err, cloud.Quota)
	})

	t.Run("throttled briefly is retried", func(t *testing.T) {
		c.Throttle(2, 0)
		if _, err := p.List(ctx, nil); err != nil {
			t.Fatalf("after two throttled answers without Retry-After: %v", err)
		}
		c.Throttle(1, time.Second)
		start := time.Now()
		if _, err := p.List(ctx, nil); err != nil {
			t.Fatalf("after a throttled answer with Retry-After 1: %v", err)
		}
		// A lower bound only: the retry may not come before the cloud said.
		if waited := time.Since(start); waited < time.Second {
			t.Fatalf("retried after %s; the cloud asked for 1s", waited)
		}
	})

	t.Run("throttled for long comes back typed", func(t *testing.T) {
		c.Throttle(100, 0)
		_, err := p.List(ctx, nil)
		c.Throttle(0, 0)
		wantKind(t, "list under lasting throttling", err, cloud.Throttled)

		c.Throttle(1, time.Minute)
		_, err = p.Get(ctx, "vm-any")
		wantKind(t, "get asked to wait a minute", err, cloud.Throttled)
		if ra := cloud.RetryAfterOf(err); ra != time.Minute {
			t.Fatalf("RetryAfter %s, want 1m", ra)
		}
	})

	t.Run("boot failure", func(t *testing.T) {
		c.FailBoots(1)
		c.SetBootDelay(0)
		defer c.SetBootDelay(time.Hour)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "doomed", Tags: map[string]string{"pool": "doomed"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitFor(ctx, inst.ID, vmcloud.Gone); err != nil {
			t.Fatal(err)
		}
		got, err := p.Get(ctx, inst.ID)
		if err != nil || got.State != cloud.StateGone {
			t.Fatalf("get after a failed boot: %+v, %v", got, err)
		}
		if l, err := p.List(ctx, map[string]string{"pool": "doomed"}); err != nil || len(l) != 0 {
			t.Fatalf("List shows %v, %v", ids(l), err)
		}
	})

	t.Run("bad request", func(t *testing.T) {
		_, err := p.Launch(ctx, cloud.LaunchRequest{})
		wantKind(t, "launch without a token", err, cloud.BadConfig)
		_, err = p.Launch(ctx, cloud.LaunchRequest{Token: strings.Repeat("x", 200)})
		wantKind(t, "launch with an overlong token", err, cloud.BadConfig)
	})
}

func TestCredentials(t *testing.T) {
	c, _, _ := setup(t, time.Hour)
	ctx := testContext(t)
	for _, tc := range []struct {
		name    string
		secrets secrets
		kind    cloud.Kind
		mention []string
	}{
		{"wrong key", secrets{secretName: {"api-key": []byte("not-the-key")}}, cloud.Auth, []string{secretName, "api-key", "401"}},
		{"no secret", secrets{}, cloud.Auth, []string{secretName, "api-key"}},
		{"no api-key in it", secrets{secretName: {"token": []byte(apiKey)}}, cloud.Auth, []string{secretName, "api-key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, c.URL(), tc.secrets)
			_, err := p.List(ctx, nil)
			wantKind(t, "list", err, tc.kind)
			if !tc.kind.Permanent() {
				t.Fatalf("%s is not permanent: waiting tasks would wait for nothing", tc.kind)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not mention %s", err, m)
				}
			}
			if strings.Contains(err.Error(), "not-the-key") || strings.Contains(err.Error(), apiKey) {
				t.Errorf("the error shows a key: %q", err)
			}
		})
	}
	if n := c.LaunchCount(); n != 0 {
		t.Fatalf("LaunchCount %d", n)
	}

	// A Secret that cannot be read just now is no reason to fail waiting tasks.
	p, err := cloud.New("local-vm", cloud.Settings{
		Values: map[string]string{"endpoint": c.URL(), "secret": secretName},
		Secret: func(context.Context, string) (map[string][]byte, error) {
			return nil, errors.New("connection to the apiserver refused")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.List(ctx, nil)
	wantKind(t, "list while Secrets cannot be read", err, cloud.Transient)
}

func TestSetup(t *testing.T) {
	if !slices.Contains(cloud.Types(), "local-vm") {
		t.Fatalf("local-vm is not registered: %v", cloud.Types())
	}
	read := goodSecrets().Read
	for _, values := range []map[string]string{
		{"secret": secretName},
		{"endpoint": "127.0.0.1:8790", "secret": secretName},
		{"endpoint": "ftp://127.0.0.1:8790", "secret": secretName},
		{"endpoint": "http://", "secret": secretName},
		{"endpoint": "http://[::1", "secret": secretName},
		{"endpoint": "http://127.0.0.1:8790"},
	} {
		_, err := cloud.New("local-vm", cloud.Settings{Platform: "p", Values: values, Secret: read})
		if cloud.KindOf(err) != cloud.BadConfig {
			t.Errorf("New(%v): %v, want a BadConfig error", values, err)
		}
	}
	p := newProvider(t, "http://127.0.0.1:8790/some/prefix/", goodSecrets())
	if p.AdminUser() != "root" {
		t.Errorf("AdminUser %q", p.AdminUser())
	}
}

// What reaches berth when the cloud cannot be reached, or something in between answers
// instead of it.
func TestUnreachableAndForeignAnswers(t *testing.T) {
	ctx := testContext(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close()
	_, err = newProvider(t, "http://"+closedAddr, goodSecrets()).List(ctx, nil)
	wantKind(t, "list from a cloud that is down", err, cloud.Transient)

	for _, tc := range []struct {
		status int
		body   string
		kind   cloud.Kind
	}{
		{http.StatusBadGateway, "<html>bad gateway</html>", cloud.Transient},
		{http.StatusInternalServerError, `{"code":"Internal","message":"oops"}`, cloud.Transient},
		{http.StatusServiceUnavailable, "overloaded", cloud.Capacity},
		{http.StatusOK, "not json", cloud.Transient},
		{http.StatusOK, `{"instances":[{"id":"vm-1","state":"hibernating"}]}`, cloud.Transient},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			w.Write([]byte(tc.body))
		}))
		_, err := newProvider(t, srv.URL, goodSecrets()).List(ctx, nil)
		srv.Close()
		wantKind(t, tc.body, err, tc.kind)
	}
}
