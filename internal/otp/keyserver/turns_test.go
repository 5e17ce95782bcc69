package keyserver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// waiter is a redemption that takes a turn, says when it got it, and holds it until told.
type waiter struct {
	namespace string
	got       chan struct{}
	done      chan struct{}
	err       error
}

func queueFor(turns *keyserver.Turns, ns string, granted chan<- *waiter) *waiter {
	w := &waiter{namespace: ns, got: make(chan struct{}), done: make(chan struct{})}
	go func() {
		release, err := turns.Take(context.Background(), ns)
		w.err = err
		close(w.got)
		if granted != nil {
			granted <- w
		}
		if err == nil {
			<-w.done
			release()
		}
	}()
	return w
}

// One namespace fills every slot and lines up fifty more redemptions; another namespace's one
// redemption comes after them, and gets the first slot the first namespace does not take back
// at once: the second slot given back, whatever the length of the first one's line.
func TestTurnsGoRoundTheNamespaces(t *testing.T) {
	turns := keyserver.NewTurns(2, time.Hour)
	granted := make(chan *waiter, 100)
	held := []*waiter{queueFor(turns, "flood", nil), queueFor(turns, "flood", nil)}
	for _, w := range held {
		<-w.got
	}
	var flood []*waiter
	for range 50 {
		flood = append(flood, queueFor(turns, "flood", granted))
	}
	waitFor(t, "fifty redemptions wait in one line", func() bool { n, lines := turns.Waiting(); return n == 50 && lines == 1 })
	other := queueFor(turns, "other", granted)
	waitFor(t, "the other namespace waits too", func() bool { n, lines := turns.Waiting(); return n == 51 && lines == 2 })

	close(held[0].done)
	first := <-granted
	close(held[1].done)
	second := <-granted
	if first.namespace != "flood" || second != other {
		t.Fatalf("after two slots were given back the grants went to %s and %s; want flood then other", first.namespace, second.namespace)
	}
	// The rest of the line is served, every slot comes back, and nothing is left of the lines.
	close(first.done)
	close(other.done)
	for range 49 {
		w := <-granted
		close(w.done)
	}
	for _, w := range flood {
		<-w.got
		if w.err != nil {
			t.Fatalf("a waiting redemption failed: %v", w.err)
		}
	}
	if n, lines := turns.Waiting(); n != 0 || lines != 0 {
		t.Fatalf("%d redemptions in %d lines still wait", n, lines)
	}
	assertSlotsFree(t, turns, 2)
}

// A redemption that waits longer than the wait, or whose client went away, gives up its place
// and holds no slot.
func TestTurnsWaitAtMostTheWait(t *testing.T) {
	turns := keyserver.NewTurns(1, 50*time.Millisecond)
	release, err := turns.Take(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := turns.Take(context.Background(), "b"); !errors.Is(err, keyserver.ErrCrowded) {
		t.Fatalf("past the wait: %v, want ErrCrowded", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := turns.Take(ctx, "b"); !errors.Is(err, context.Canceled) {
		t.Fatalf("the client went away: %v, want its context's error", err)
	}
	if n, lines := turns.Waiting(); n != 0 || lines != 0 {
		t.Fatalf("%d redemptions in %d lines still wait", n, lines)
	}
	release()
	release() // twice: given back once
	assertSlotsFree(t, turns, 1)
}

// Many redemptions of many namespaces that give up while slots are handed over leave every slot
// free once they are done: none is lost to a hand-over that met a wait's end.
func TestTurnsLoseNoSlot(t *testing.T) {
	const slots = 4
	turns := keyserver.NewTurns(slots, time.Millisecond)
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			if release, err := turns.Take(context.Background(), fmt.Sprint("ns-", i%7)); err == nil {
				time.Sleep(time.Duration(i%3) * time.Millisecond)
				release()
			}
		})
	}
	wg.Wait()
	if n, lines := turns.Waiting(); n != 0 || lines != 0 {
		t.Fatalf("%d redemptions in %d lines still wait", n, lines)
	}
	assertSlotsFree(t, turns, slots)
}

// assertSlotsFree takes n slots and gives them back. Free slots are taken without waiting; a
// lost one would be waited for until the deadline, which only guards against hanging.
func assertSlotsFree(t *testing.T, turns *keyserver.Turns, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var releases []func()
	for i := range n {
		release, err := turns.Take(ctx, "check")
		if err != nil {
			t.Fatalf("slot %d of %d is not free: %v", i+1, n, err)
		}
		releases = append(releases, release)
	}
	for _, r := range releases {
		r()
	}
}
