package keyserver_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// One tenant's pods, from several addresses, hold requests open without sending their bodies,
// replay the redeemed token of a task that Tekton retries (spec.retries: 2) and redeem their own
// tasks' tokens as fast as they can, while another tenant's tasks redeem theirs one after
// another from an address of their own. With two slots at the apiserver, every redemption of
// the other tenant succeeds: a request that has not sent its body holds no slot, a replay is
// refused from memory, and the flood's own redemptions take turns with the other namespace's.
// The apiserver sees exactly the redemptions that hand out a key, none for a replay.
func TestOneTenantsFloodDelaysAnotherOnlyByTurns(t *testing.T) {
	const flooder = "flood"
	ctx := context.Background()
	if err := cp.EnsureNamespace(ctx, flooder); err != nil {
		t.Fatal(err)
	}
	dir, ca := certDir(t)
	ks := newIndexed(t, keyserver.DefaultUnsureReads, keyserver.DefaultUnsureBurst, true)
	ks.store.Attempts = controllerCache(t)
	ks.store.Turns = keyserver.NewTurns(2, 0)
	limits := keyserver.NewLimiter(keyserver.DefaultLimits())
	s := serveHandler(t, &keyserver.Handler{Store: ks.store, Limits: limits, Log: logr.Discard()}, dir, ca)

	// The flooding tenant's retried task has redeemed its key in the attempt it is in.
	retried := newTaskIn(t, flooder, 2)
	startAttempt(t, retried, 1, time.Now())
	replayed, err := ks.store.Put(ctx, privateKey(t), retried.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the controller's cache shows the retried task's attempt", func() bool {
		n, ok := ks.store.Attempts.Attempt(ctx, retried.rec.Name)
		return ok && n == 1
	})
	if status, _ := s.post(t, "/otp", replayed.String()); status != http.StatusOK {
		t.Fatalf("the retried task's own redemption: %d", status)
	}
	// Its other tasks' tokens, each redeemed once by the flood.
	const own = 24
	var ownTokens []string
	for range own {
		k := newTaskIn(t, flooder, 0)
		tok, err := ks.store.Put(ctx, privateKey(t), k.binding(), "")
		if err != nil {
			t.Fatal(err)
		}
		ownTokens = append(ownTokens, tok.String())
	}
	// The other tenant's tasks.
	const others = 10
	type kept struct{ token, key string }
	var otherTokens []kept
	for range others {
		k := newTask(t)
		key := privateKey(t)
		tok, err := ks.store.Put(ctx, key, k.binding(), "")
		if err != nil {
			t.Fatal(err)
		}
		otherTokens = append(otherTokens, kept{tok.String(), string(key)})
	}

	// Requests that send their headers and never their body, each from an address of its own.
	// The limiter remembers the addresses heard so far (the retried task's came from
	// 127.0.0.1); all eight are in once it remembers eight more.
	heard := limits.Len()
	port := strings.TrimPrefix(s.url, "https://127.0.0.1:")
	tlsConfig := from(ca, "127.0.0.1").Transport.(*http.Transport).TLSClientConfig
	for i := range 8 {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 10+i))}}
		conn, err := tls.DialWithDialer(d, "tcp", "127.0.0.1:"+port, tlsConfig)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := io.WriteString(conn, "POST /otp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 43\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the eight silent requests are let in", func() bool { return limits.Len() == heard+8 })

	before := ks.calls.n.Load()
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var redeemed, unexpected atomic.Int64
	for src := range 4 {
		c := from(ca, fmt.Sprintf("127.0.0.%d", 2+src))
		post := func(token string) int {
			resp, err := c.Post(s.url+"/otp", "application/x-www-form-urlencoded", strings.NewReader(token))
			if err != nil {
				unexpected.Add(1)
				return 0
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		flood.Go(func() {
			mine := ownTokens[src*own/4 : (src+1)*own/4]
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Each of its own tokens until one is redeemed (429 says come back), and the
				// replayed one between them.
				if len(mine) > 0 {
					switch post(mine[0]) {
					case http.StatusOK:
						redeemed.Add(1)
						mine = mine[1:]
					case http.StatusTooManyRequests:
					default:
						unexpected.Add(1)
					}
				}
				switch post(replayed.String()) {
				case http.StatusNotFound, http.StatusTooManyRequests:
				default:
					unexpected.Add(1)
				}
			}
		})
	}
	victim := from(ca, "127.0.0.9")
	for i, k := range otherTokens {
		resp, err := victim.Post(s.url+"/otp", "application/x-www-form-urlencoded", strings.NewReader(k.token))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != k.key {
			t.Errorf("the other tenant's redemption %d of %d during the flood: %d %q; want its key", i+1, others, resp.StatusCode, body)
		}
	}
	close(stop)
	flood.Wait()
	if n := unexpected.Load(); n > 0 {
		t.Errorf("%d of the flood's requests got an answer other than its key, 404 or 429", n)
	}
	// Each redemption that hands out a key of a task not retried costs four requests (read the
	// key, its record and the TaskRun; delete the key); nothing else reached the apiserver.
	want := 4 * (others + redeemed.Load())
	if n := ks.calls.n.Load() - before; n != want {
		t.Fatalf("the apiserver saw %d requests during the flood; want %d, those of the %d redemptions that handed out a key", n, want, others+redeemed.Load())
	}
}
