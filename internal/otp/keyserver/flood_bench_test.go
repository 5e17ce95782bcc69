package keyserver_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/otp"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// BenchmarkStoreRedeem measures a real task's store and redemption of a key (Put through the
// controller's client, then POST /otp over HTTPS), quiet and under a flood of random tokens
// from 50 clients at one address (127.0.0.2). Each real redemption comes from an address of
// its own (127.0.1.x, round the 250 of them), as each task's pod has its own IP. It reports p50 and p99 of each
// in milliseconds. "shared" is the server as it was before the index and limits: one client,
// and so one limiter, for the controller's stores and the redemptions, at the controller's
// limits scaled down 100x (5/s, burst 10) as in the reproduction. Run it with a fixed
// count, e.g. -bench StoreRedeem -benchtime 200x.
func BenchmarkStoreRedeem(b *testing.B) {
	for _, c := range []struct {
		name   string
		flood  bool
		shared bool
	}{
		{"quiet", false, false},
		{"flood", true, false},
		{"shared/quiet", false, true},
		{"shared/flood", true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			dir, ca := certDir(b)
			var controllerStore, redeemer *keyserver.Store
			var h *keyserver.Handler
			if c.shared {
				cfg := rest.CopyConfig(cp.ConfigFor(namespace, controller))
				cfg.QPS, cfg.Burst = 5, 10
				shared, err := client.New(cfg, client.Options{Scheme: cp.Client.Scheme()})
				if err != nil {
					b.Fatal(err)
				}
				controllerStore = &keyserver.Store{Client: shared, Namespace: namespace}
				redeemer = controllerStore
				h = &keyserver.Handler{Store: redeemer, Log: logr.Discard()}
			} else {
				ks := newIndexed(b, keyserver.DefaultUnsureReads, keyserver.DefaultUnsureBurst, true)
				redeemer = ks.store
				controllerStore = newStore(b)
				controllerStore.Index = ks.index
				h = &keyserver.Handler{Store: redeemer, Limits: keyserver.NewLimiter(keyserver.DefaultLimits()), Log: logr.Discard()}
			}
			s := serveHandler(b, h, dir, ca)
			stop := func() map[int]int { return nil }
			if c.flood {
				stop = floodFrom(b, s.url, from(ca, "127.0.0.2"))
			}
			var tasks []*http.Client
			for i := 1; i <= 250; i++ {
				tasks = append(tasks, from(ca, fmt.Sprintf("127.0.1.%d", i)))
			}
			key := privateKey(b)
			stores := make([]time.Duration, 0, b.N)
			redeems := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				began := time.Now()
				tok, err := controllerStore.Put(context.Background(), key, nil, "")
				if err != nil {
					b.Fatal(err)
				}
				stored := time.Now()
				task := tasks[len(stores)%len(tasks)]
				status, answer, err := redeemWith(task, s.url, tok.String())
				if err != nil || status != http.StatusOK || answer != string(key) {
					b.Fatalf("a real redemption: %d %q %v", status, answer, err)
				}
				stores = append(stores, stored.Sub(began))
				redeems = append(redeems, time.Since(stored))
			}
			b.StopTimer()
			answers := stop()
			report(b, "store", stores)
			report(b, "redeem", redeems)
			if c.flood {
				total := 0
				for _, n := range answers {
					total += n
				}
				b.ReportMetric(float64(total), "flood-requests")
				b.Logf("flood answers: %v", answers)
			}
		})
	}
}

// floodFrom sends random tokens from 50 clients of hc until the returned stop is called; stop
// returns how many answers of each status the flood got.
func floodFrom(b *testing.B, url string, hc *http.Client) (stop func() map[int]int) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[int]int{}
	for range 50 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				status, _, err := post(hc, url+"/otp", otp.NewToken().String())
				if err != nil {
					status = -1
				}
				mu.Lock()
				answers[status]++
				mu.Unlock()
			}
		})
	}
	// Let the flood reach full strength before the first real request.
	time.Sleep(500 * time.Millisecond)
	var once sync.Once
	stop = func() map[int]int {
		once.Do(func() { close(done); wg.Wait(); hc.CloseIdleConnections() })
		mu.Lock()
		defer mu.Unlock()
		return answers
	}
	b.Cleanup(func() { stop() })
	return stop
}

// redeemWith POSTs a token as a task's curl does, on a connection of its own.
func redeemWith(hc *http.Client, url, token string) (int, string, error) {
	defer hc.CloseIdleConnections()
	resp, err := hc.Post(url+"/otp", "application/x-www-form-urlencoded", strings.NewReader(token))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer), err
}

func post(hc *http.Client, url, body string) (int, string, error) {
	resp, err := hc.Post(url, "application/x-www-form-urlencoded", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), err
}

// report adds p50 and p99 of ds, in milliseconds, to the benchmark's results.
func report(b *testing.B, what string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), what+"-p50-ms")
	b.ReportMetric(at(0.99), what+"-p99-ms")
}
