package keyserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/rbac"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// The package's tests share one control plane, with berth's RBAC applied: the key server runs
// as berth's controller ServiceAccount, so a permission it lacks fails here.
var cp *controlplane.ControlPlane

const (
	namespace  = "berth-system" // berth's: the kept keys and the records
	tenant     = "builds"       // where TaskRuns run
	controller = "berth-controller"
)

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunTestsWith(m, &cp, []controlplane.Option{controlplane.WithoutGarbageCollector()}, setup))
}

func setup(ctx context.Context) error {
	if err := rbac.Apply(ctx, cp.Client, namespace); err != nil {
		return err
	}
	if err := cp.EnsureNamespace(ctx, tenant); err != nil {
		return err
	}
	// What docs/otp.md asks of an operator who opens POST /store-key: the server may ask the
	// apiserver who a token belongs to.
	return cp.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "berth-controller-token-review"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: controller}},
	})
}

// asController is a client acting as berth's controller.
func asController(t testing.TB) client.Client {
	t.Helper()
	c, err := client.New(cp.ConfigFor(namespace, controller), client.Options{Scheme: cp.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newStore is a store in berth's namespace, as the controller makes it.
func newStore(t testing.TB) *keyserver.Store {
	return &keyserver.Store{Client: asController(t), Namespace: namespace}
}

// task is a user TaskRun holding a build host, and berth's record of it.
type task struct {
	tr  *pipelinev1.TaskRun
	rec *berthv1.Allocation
}

func newTask(t testing.TB) task {
	t.Helper()
	return newRetriedTask(t, 0)
}

// newRetriedTask is newTask for a TaskRun that Tekton retries up to retries times, as a
// pipeline task with `retries: N` makes it.
func newRetriedTask(t testing.TB, retries int) task {
	t.Helper()
	return newTaskIn(t, tenant, retries)
}

// newTaskIn is newRetriedTask in namespace ns (which must exist).
func newTaskIn(t testing.TB, ns string, retries int) task {
	t.Helper()
	ctx := context.Background()
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "build-", Namespace: ns},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "buildah-remote"}, Retries: retries,
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues("linux/s390x")}}},
	}
	if err := cp.Client.Create(ctx, tr); err != nil {
		t.Fatal(err)
	}
	rec := &berthv1.Allocation{
		ObjectMeta: metav1.ObjectMeta{Name: string(tr.UID), Namespace: namespace},
		Spec: berthv1.AllocationSpec{
			TaskRun:  berthv1.TaskRunRef{Namespace: tr.Namespace, Name: tr.Name, UID: tr.UID},
			Platform: "linux/s390x", Strategy: "static", Queued: tr.CreationTimestamp,
		},
		Status: berthv1.AllocationStatus{Phase: berthv1.PhaseReady, BuildUser: hostops.UserName(string(tr.UID), 1), Attempt: 1},
	}
	if err := cp.Client.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	return task{tr: tr, rec: rec}
}

func (k task) binding() *keyserver.Binding {
	return &keyserver.Binding{Allocation: k.rec.Name, AllocationUID: k.rec.UID, BuildUser: k.rec.Status.BuildUser, Namespace: k.tr.Namespace}
}

// privateKey is a build user's key as berth makes them, in OpenSSH's format.
func privateKey(t testing.TB) []byte {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block)
}

// certDir holds a serving certificate for 127.0.0.1 from a CA of its own, as cert-manager's
// Secret is mounted.
func certDir(t testing.TB) (dir string, ca *tlscerts.CA) {
	t.Helper()
	ca, err := tlscerts.NewCA("berth-otp-test-ca")
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if _, err := ca.WriteDir(dir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	return dir, ca
}

// server is a key server serving over HTTPS on a port of its own.
type server struct {
	url    string // https://127.0.0.1:<port>
	client *http.Client
	stop   func()
}

// serve runs a key server over store with the certificate of dir; nil storeKey refuses every
// POST /store-key. It is stopped when the test ends, if not before.
func serve(t *testing.T, store *keyserver.Store, dir string, ca *tlscerts.CA, storeKey keyserver.Authenticator) *server {
	t.Helper()
	return serveHandler(t, &keyserver.Handler{Store: store, StoreKey: storeKey, Log: logr.Discard()}, dir, ca)
}

// serveHandler is serve for a handler made by the test.
func serveHandler(t testing.TB, h *keyserver.Handler, dir string, ca *tlscerts.CA) *server {
	t.Helper()
	certs, err := certwatcher.New(filepath.Join(dir, keyserver.CertFile), filepath.Join(dir, keyserver.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	endpoint := &keyserver.Endpoint{Listener: ln, Certs: certs, Handler: h}
	done := make(chan error, 2)
	go func() { done <- certs.Start(ctx) }()
	go func() { done <- endpoint.Start(ctx) }()
	c := trusting(ca)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			// A connection the client opened but sent nothing on yet holds the server's
			// graceful shutdown for 5 s (net/http counts it idle only then): the client
			// lets go of its connections first, as a task's curl does when it exits.
			c.CloseIdleConnections()
			cancel()
			for range 2 {
				if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
					t.Errorf("the key server: %v", err)
				}
			}
		}
	}
	t.Cleanup(stop)
	return &server{url: "https://" + ln.Addr().String(), client: c, stop: stop}
}

// trusting is an HTTPS client that trusts only ca, as a task given otp-ca does.
func trusting(ca *tlscerts.CA) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 100,
	}}
}

// post sends body to path and returns the status and the answer.
func (s *server) post(t *testing.T, path, body string, header ...string) (int, string) {
	t.Helper()
	status, answer, err := s.try(http.MethodPost, path, body, header...)
	if err != nil {
		t.Fatal(err)
	}
	return status, answer
}

// try is post without a test, for goroutines; header is name, value pairs.
func (s *server) try(method, path, body string, header ...string) (int, string, error) {
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends it
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer), err
}

// keptKeys are the names of the key Secrets in berth's namespace.
func keptKeys(t *testing.T) map[string]bool {
	t.Helper()
	var list corev1.SecretList
	if err := cp.Client.List(context.Background(), &list, client.InNamespace(namespace), client.MatchingLabels{keyserver.KeyLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, s := range list.Items {
		names[s.Name] = true
	}
	return names
}

// isKept tells whether a key is kept under the Secret name.
func isKept(t *testing.T, name string) bool {
	t.Helper()
	err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, &corev1.Secret{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// counter reads a counter the key server exports, by its one label's value.
func counter(t *testing.T, name, label string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// eventually polls cond for up to a minute.
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	}); err != nil {
		t.Fatalf("never: %s (last error: %v)", what, last)
	}
}

// replaysRefused reads berth_otp_replays_refused_total.
func replaysRefused(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "berth_otp_replays_refused_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
