package keyserver_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/otp"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// apiCounter counts the requests a client sends to the apiserver.
type apiCounter struct{ n atomic.Int64 }

func (c *apiCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		c.n.Add(1)
		return rt.RoundTrip(r)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// indexed is a key server's redeeming side as Serve makes it: a store with a client of its own,
// whose every apiserver request is counted, and the index of kept keys.
type indexed struct {
	store *keyserver.Store
	index *keyserver.Index
	calls *apiCounter
}

// newIndexed makes one; start runs its index (until the test ends) and waits until the index
// is current.
func newIndexed(t testing.TB, unsureReads float64, unsureBurst int, start bool) indexed {
	t.Helper()
	calls := &apiCounter{}
	cfg := rest.CopyConfig(cp.ConfigFor(namespace, controller))
	cfg.WrapTransport = calls.wrap
	c, err := client.New(cfg, client.Options{Scheme: cp.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	index, err := keyserver.NewIndex(cp.ConfigFor(namespace, controller), namespace, unsureReads, unsureBurst)
	if err != nil {
		t.Fatal(err)
	}
	if start {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = index.Start(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		waitFor(t, "the index is current", func() bool { return index.Knows(otp.NewToken().Name()) == keyserver.Unknown })
	}
	return indexed{store: &keyserver.Store{Client: c, Namespace: namespace, Index: index}, index: index, calls: calls}
}

// waitFor polls cond for up to a minute.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

func TestUnknownTokensCostTheAPIServerNothing(t *testing.T) {
	dir, ca := certDir(t)
	ks := newIndexed(t, keyserver.DefaultUnsureReads, keyserver.DefaultUnsureBurst, true)
	s := serveHandler(t, &keyserver.Handler{Store: ks.store, Log: logr.Discard()}, dir, ca)

	// A thousand random tokens from twenty clients at once: all unknown, none asked about.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			errs <- func() error {
				for range 50 {
					status, answer, err := s.try(http.MethodPost, "/otp", otp.NewToken().String())
					if err != nil {
						return err
					}
					if status != http.StatusNotFound || !strings.Contains(answer, "unknown or already used") {
						return fmt.Errorf("a random token: %d %q", status, answer)
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := ks.calls.n.Load(); n != 0 {
		t.Fatalf("1000 random tokens cost %d apiserver requests, want none", n)
	}

	// A key another process keeps (the controller, while this server runs alone) is known
	// once the watch brings its name, and redeemed once.
	k := newTask(t)
	key := privateKey(t)
	tok, err := newStore(t).Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index learns of the key kept by another process", func() bool { return ks.index.Knows(tok.Name()) == keyserver.Known })
	if status, answer := s.post(t, "/otp", tok.String()); status != http.StatusOK || answer != string(key) {
		t.Fatalf("redeeming a kept key: %d %q", status, answer)
	}
	if ks.calls.n.Load() == 0 {
		t.Fatal("a redemption went through no apiserver request of the server's own client")
	}
	// Forgotten at once by the server that claimed it: the second try costs nothing.
	before := ks.calls.n.Load()
	if status, _ := s.post(t, "/otp", tok.String()); status != http.StatusNotFound {
		t.Fatalf("a second redemption: %d, want 404", status)
	}
	if n := ks.calls.n.Load() - before; n != 0 {
		t.Fatalf("a second redemption cost %d apiserver requests", n)
	}

	// The server that keeps a key knows it at once: no wait for its own watch.
	own := newTask(t)
	tok, err = ks.store.Put(context.Background(), key, own.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	if status, answer := s.post(t, "/otp", tok.String()); status != http.StatusOK || answer != string(key) {
		t.Fatalf("redeeming a key the server kept itself, at once: %d %q", status, answer)
	}
	if keptKeys(t)[tok.Name()] {
		t.Fatal("the redeemed key is still kept")
	}
}

func TestIndexNotCurrentReadsWithinABudget(t *testing.T) {
	dir, ca := certDir(t)
	// Never started: the index is not current, as before its first list, and does not become
	// current within UnsureWait.
	ks := newIndexed(t, 0.001, 2, false)
	s := serveHandler(t, &keyserver.Handler{Store: ks.store, Log: logr.Discard()}, dir, ca)
	k := newTask(t)
	key := privateKey(t)
	tok, err := newStore(t).Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	if ks.index.Knows(tok.Name()) != keyserver.Unsure {
		t.Fatal("an index that never listed claims to know")
	}
	// A real token is read from the apiserver: one read of the budget.
	if status, answer := s.post(t, "/otp", tok.String()); status != http.StatusOK || answer != string(key) {
		t.Fatalf("redeeming while the index is not current: %d %q", status, answer)
	}
	// The second read of the budget answers a random token for certain.
	before := ks.calls.n.Load()
	if status, _ := s.post(t, "/otp", otp.NewToken().String()); status != http.StatusNotFound {
		t.Fatalf("a random token within the budget: %d, want 404", status)
	}
	if ks.calls.n.Load() == before {
		t.Fatal("a token the index could not judge was refused without asking the apiserver")
	}
	// Past the budget: "try again", and the apiserver is not asked.
	before = ks.calls.n.Load()
	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, s.url+"/otp", strings.NewReader(otp.NewToken().String()))
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("past the budget: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if n := ks.calls.n.Load() - before; n != 0 {
		t.Fatalf("past the budget, 3 tokens cost %d apiserver requests", n)
	}
}

func TestSourceLimitsAnswer429(t *testing.T) {
	dir, ca := certDir(t)
	ks := newIndexed(t, keyserver.DefaultUnsureReads, keyserver.DefaultUnsureBurst, true)
	// One request every 100 s after a burst of three: the fourth is over the rate for sure.
	limits := keyserver.NewLimiter(keyserver.Limits{SourceRate: 0.01, SourceBurst: 3})
	s := serveHandler(t, &keyserver.Handler{Store: ks.store, Limits: limits, Log: logr.Discard()}, dir, ca)
	for i := range 3 {
		if status, _ := s.post(t, "/otp", otp.NewToken().String()); status != http.StatusNotFound {
			t.Fatalf("request %d within the burst: %d, want 404", i+1, status)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, s.url+"/otp", strings.NewReader(otp.NewToken().String()))
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || wait < 90 || wait > 100 {
		t.Fatalf("past the burst: %d, Retry-After %q; want 429 and about 100 s", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// Another address is another source: untouched by the first one's flood.
	other := from(ca, "127.0.0.2")
	req, _ = http.NewRequest(http.MethodPost, s.url+"/otp", strings.NewReader(otp.NewToken().String()))
	if resp, err = other.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another source: %d, want 404", resp.StatusCode)
	}
}

// from is a client trusting ca whose connections come from the loopback address ip.
func from(ca *tlscerts.CA, ip string) *http.Client {
	c := trusting(ca)
	tr := c.Transport.(*http.Transport)
	tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.MinVersion = tls.VersionTLS12
	return c
}

func TestLimiterConcurrencyAndMemory(t *testing.T) {
	l := keyserver.NewLimiter(keyserver.Limits{SourceRate: 1000, SourceBurst: 1000, SourceConcurrency: 2, Sources: 100, Concurrency: 5})
	a1, _, _ := l.Admit("198.18.0.2")
	a2, _, _ := l.Admit("198.18.0.2")
	if a1 == nil || a2 == nil {
		t.Fatal("a source's first two requests were refused")
	}
	if release, why, wait := l.Admit("198.18.0.2"); release != nil || why != "source-concurrency" || wait <= 0 {
		t.Fatalf("a source's third request at once: admitted %v, %q, retry after %v", release != nil, why, wait)
	}
	a1()
	a1() // twice: counted once
	a3, _, _ := l.Admit("198.18.0.2")
	if a3 == nil {
		t.Fatal("a source that answered one request is still refused")
	}
	// Other sources are not held back by one source at its limit: the redemptions at the
	// apiserver are shared by namespace (Turns), not by a pool of all addresses' requests.
	var others []func()
	for i := range 10 {
		release, why, _ := l.Admit(fmt.Sprintf("198.18.%d.2", i+1))
		if release == nil {
			t.Fatalf("source %d refused while the first is at its limit: %s", i+1, why)
		}
		others = append(others, release)
	}
	for _, release := range append(others, a2, a3) {
		release()
	}

	// A flood from ten thousand addresses keeps at most Sources of them.
	var refused []string
	for i := range 10000 {
		addr := fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)
		release, why, _ := l.Admit(addr)
		if release == nil {
			refused = append(refused, addr+": "+why)
			continue
		}
		release()
	}
	if len(refused) > 0 {
		t.Fatalf("%d new sources refused, e.g. %s", len(refused), refused[0])
	}
	if n := l.Len(); n > 100 {
		t.Fatalf("the limiter remembers %d sources, want at most 100", n)
	}
	// Every slot was given back, however many sources were forgotten in between.
	for _, addr := range []string{"198.18.0.2", "198.18.0.2"} {
		release, why, _ := l.Admit(addr)
		if release == nil {
			t.Fatalf("a source refused after the flood: %s", why)
		}
		defer release()
	}
}
