package keyserver_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// Keys outlive the server: one stored through a server that is then stopped (without a word
// to anyone: nothing is handed over) is redeemed, once, through `berth otp-server` started
// afterwards, as is a key berth's controller kept for a task.
func TestKeysOutliveTheServer(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	storer := serviceAccount(t, "ci", "key-uploader")
	first := serve(t, store, dir, ca, keyserver.ServiceAccounts{Client: store.Client, Allowed: []string{"ci/key-uploader"}})
	stored := privateKey(t)
	status, tok := first.post(t, "/store-key", string(stored), "Authorization", "Bearer "+storer)
	if status != http.StatusOK {
		t.Fatalf("POST /store-key: %d %q", status, tok)
	}
	k := newTask(t)
	bound := privateKey(t)
	boundTok, err := store.Put(context.Background(), bound, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := runOTPServerCommand(t, dir, ca)
	for _, c := range []struct {
		token string
		key   []byte
	}{{tok, stored}, {boundTok.String(), bound}} {
		if status, body := second.post(t, "/otp", c.token); status != http.StatusOK || body != string(c.key) {
			t.Fatalf("redeeming after the restart: %d %q", status, body)
		}
		if status, body := second.post(t, "/otp", c.token); status != http.StatusNotFound || body != keyserver.ErrUnknown.Error() {
			t.Fatalf("redeeming a second time: %d %q", status, body)
		}
	}
}

// runOTPServerCommand runs `berth otp-server` in this process as berth's controller
// ServiceAccount, and returns once it answers.
func runOTPServerCommand(t *testing.T, dir string, ca *tlscerts.CA) *server {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg, err := clientcmd.Load(cp.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = "system:serviceaccount:" + namespace + ":" + controller
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
	}
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	addr := freeAddress(t)
	cmd := cli.NewRootCommand()
	cmd.SetArgs([]string{"otp-server", "--kubeconfig", kubeconfig, "--namespace", namespace, "--bind-address", addr,
		"--cert-dir", dir, "--metrics-bind-address", "0", "--health-probe-bind-address", "0"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("berth otp-server: %v", err)
		}
	})
	s := &server{url: "https://" + addr, client: trusting(ca)}
	eventually(t, "berth otp-server answers", func() (bool, error) {
		select {
		case err := <-done:
			t.Fatalf("berth otp-server exited: %v", err)
		default:
		}
		status, _, err := s.try(http.MethodGet, "/healthz", "")
		return status == http.StatusOK, err
	})
	return s
}

// freeAddress is a loopback address no one listens on now, for a server that takes an address
// and not a listener.
func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// A tenant can reach the key server (its tasks must), so POST /store-key is no open store:
// refused unless the server names ServiceAccounts that may, and then only to their tokens.
func TestStoreKeyIsNotOpen(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	closed := serve(t, store, dir, ca, nil)
	tenantToken := serviceAccount(t, tenant, "pipeline")
	before := len(keptKeys(t))
	if status, body := closed.post(t, "/store-key", string(privateKey(t)), "Authorization", "Bearer "+tenantToken); status != http.StatusForbidden ||
		body != keyserver.ErrStoreKeyDisabled.Error() {
		t.Errorf("a server that names no ServiceAccount: %d %q", status, body)
	}

	open := serve(t, store, dir, ca, keyserver.ServiceAccounts{Client: store.Client, Allowed: []string{"ci/key-uploader"}})
	for _, c := range []struct {
		name   string
		header []string
		status int
		want   string
	}{
		{"no token", nil, http.StatusUnauthorized, keyserver.ErrUnauthenticated.Error()},
		{"not a token", []string{"Authorization", "Bearer not-a-token"}, http.StatusUnauthorized, keyserver.ErrUnauthenticated.Error()},
		{"basic auth", []string{"Authorization", "Basic dXNlcjpwYXNz"}, http.StatusUnauthorized, keyserver.ErrUnauthenticated.Error()},
		{"a tenant's ServiceAccount", []string{"Authorization", "Bearer " + tenantToken}, http.StatusForbidden, keyserver.ErrForbidden.Error()},
	} {
		if status, body := open.post(t, "/store-key", string(privateKey(t)), c.header...); status != c.status || body != c.want {
			t.Errorf("%s: %d %q; want %d %q", c.name, status, body, c.status, c.want)
		}
	}
	if after := len(keptKeys(t)); after != before {
		t.Fatalf("refused requests kept %d keys", after-before)
	}
	if got := counter(t, "berth_otp_store_key_refusals_total", "forbidden"); got < 1 {
		t.Errorf("berth_otp_store_key_refusals_total{reason=forbidden} is %v", got)
	}

	key := privateKey(t)
	status, tok := open.post(t, "/store-key", string(key), "Authorization", "Bearer "+serviceAccount(t, "ci", "key-uploader"))
	if status != http.StatusOK {
		t.Fatalf("the allowed ServiceAccount: %d %q", status, tok)
	}
	if status, body := open.post(t, "/otp", tok); status != http.StatusOK || body != string(key) {
		t.Fatalf("redeeming the stored key: %d %q", status, body)
	}
}

// serviceAccount makes a ServiceAccount and returns a token of it, as a pod of it would have.
func serviceAccount(t *testing.T, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if err := cp.Client.Create(ctx, sa); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	req := &authenticationv1.TokenRequest{}
	if err := cp.Client.SubResource("token").Create(ctx, sa, req); err != nil {
		t.Fatal(err)
	}
	return req.Status.Token
}

// What a client may send is bounded, and only what the key server serves is answered.
func TestRequestsAreBounded(t *testing.T) {
	dir, ca := certDir(t)
	s := serve(t, newStore(t), dir, ca, keyserver.ServiceAccounts{Client: cp.Client, Allowed: []string{"ci/key-uploader"}})
	uploader := serviceAccount(t, "ci", "key-uploader")
	for _, c := range []struct {
		name, method, path, body string
		header                   []string
		status                   int
	}{
		{"health", http.MethodGet, "/healthz", "", nil, http.StatusOK},
		{"GET /otp", http.MethodGet, "/otp", "", nil, http.StatusMethodNotAllowed},
		{"PUT /store-key", http.MethodPut, "/store-key", "key", nil, http.StatusMethodNotAllowed},
		{"another path", http.MethodPost, "/keys", "", nil, http.StatusNotFound},
		{"a huge token", http.MethodPost, "/otp", strings.Repeat("A", 1<<20), nil, http.StatusRequestEntityTooLarge},
		{"an empty key", http.MethodPost, "/store-key", "\n", []string{"Authorization", "Bearer " + uploader}, http.StatusBadRequest},
		{"a huge key", http.MethodPost, "/store-key", strings.Repeat("A", 1<<20), []string{"Authorization", "Bearer " + uploader}, http.StatusRequestEntityTooLarge},
	} {
		status, body, err := s.try(c.method, c.path, c.body, c.header...)
		if err != nil || status != c.status {
			t.Errorf("%s: %d %q %v; want %d", c.name, status, body, err, c.status)
		}
	}
}

// A renewed certificate (cert-manager rewrites the mounted files) is served from the next
// connection on, without a restart.
func TestRenewedCertificateIsServed(t *testing.T) {
	dir, ca := certDir(t)
	s := serve(t, newStore(t), dir, ca, nil)
	first := servedCertificate(t, s)
	renewed, err := ca.WriteDir(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(renewed.CertPEM)
	eventually(t, "the renewed certificate is served", func() (bool, error) {
		return bytes.Equal(servedCertificate(t, s), block.Bytes), nil
	})
	if bytes.Equal(first, block.Bytes) {
		t.Fatal("the renewal made the same certificate")
	}
}

// servedCertificate is the leaf certificate a new connection to s is shown.
func servedCertificate(t *testing.T, s *server) []byte {
	t.Helper()
	tr := s.client.Transport.(*http.Transport)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(s.url, "https://"), tr.TLSClientConfig.Clone())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw
}

func sshSigner(key []byte) (ssh.Signer, error) { return ssh.ParsePrivateKey(key) }

// `berth otp-server` alone knows the attempt a retried task is in from a cache of its own, as
// the key server in the controller does from the controller's: once that cache has listed,
// replays of a token redeemed in the attempt are refused without asking the apiserver.
func TestOTPServerAloneRefusesReplaysFromMemory(t *testing.T) {
	dir, ca := certDir(t)
	s := runOTPServerCommand(t, dir, ca)
	k := newRetriedTask(t, 2)
	startAttempt(t, k, 1, time.Now())
	key := privateKey(t)
	tok, err := newStore(t).Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "berth otp-server's index knows the key", func() (bool, error) {
		status, body, err := s.try(http.MethodPost, "/otp", tok.String())
		if err == nil && status == http.StatusOK && body != string(key) {
			t.Fatalf("redeemed %q, not the key", body)
		}
		return status == http.StatusOK, err
	})
	// Replays come from fifty addresses in turn, so that none meets its address's rate.
	sent := 0
	replay := func() (int, string) {
		c := from(ca, fmt.Sprintf("127.0.0.%d", 20+sent%50))
		sent++
		resp, err := c.Post(s.url+"/otp", "application/x-www-form-urlencoded", strings.NewReader(tok.String()))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// The first replay lists the records and TaskRuns; until they are listed, a replay is
	// judged by the apiserver (and refused all the same).
	eventually(t, "a replay is refused from memory", func() (bool, error) {
		before := replaysRefused(t)
		if status, _ := replay(); status != http.StatusNotFound {
			t.Fatalf("a replay got %d, want 404", status)
		}
		return replaysRefused(t) > before, nil
	})
	before := replaysRefused(t)
	for range 50 {
		if status, body := replay(); status != http.StatusNotFound || body != keyserver.ErrUnknown.Error() {
			t.Fatalf("a replay: %d %q; want 404 and the message for a used token", status, body)
		}
	}
	if n := replaysRefused(t) - before; n != 50 {
		t.Fatalf("%v of 50 replays were refused from memory; want all", n)
	}
}
