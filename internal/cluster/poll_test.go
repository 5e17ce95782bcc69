package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// passedDeadline is a context whose deadline has passed and which has not been told yet: what a
// wait sees for a moment at its end, until the context's timer fires.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// A wait whose deadline has passed ends as a timeout, even when its last look failed only
// because of that deadline (client-go's rate limiter refuses a request it could not send in
// time): the step's log must not say it retries a wait that is over.
func TestPollEndsAsATimeoutOnceItsDeadlineHasPassed(t *testing.T) {
	var progress log
	done := make(chan error, 1)
	go func() {
		done <- poll(passedDeadline{context.Background()}, Polling{Timeout: time.Minute, Interval: fast.Interval}, &progress,
			func(context.Context) (bool, error) {
				return false, errors.New("client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline")
			})
	}()
	select {
	case err := <-done:
		if !isTimeout(err) {
			t.Errorf("poll = %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("poll went on after its deadline had passed; it logged:\n%s", progress.String())
	}
	if strings.Contains(progress.String(), "retrying") {
		t.Errorf("poll logged a retry of a wait that was over:\n%s", progress.String())
	}
}
