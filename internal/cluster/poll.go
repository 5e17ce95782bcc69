package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/berth-ci/berth/internal/retryable"
)

// Polling is how long a step waits for a service and how often it looks.
type Polling struct {
	Timeout  time.Duration
	Interval time.Duration
}

func (p Polling) interval() time.Duration {
	if p.Interval <= 0 {
		return 5 * time.Second
	}
	return p.Interval
}

// elapsed formats a wait's running time for progress lines: whole seconds are enough.
func elapsed(start time.Time) string {
	return time.Since(start).Round(time.Second).String()
}

// poll runs cond every p.Interval until it is done, fails, or p.Timeout passes. Errors that
// say the apiserver is briefly out of reach are retried (and told to progress): a wait of half
// an hour should not fail on one lost answer.
func poll(ctx context.Context, p Polling, progress io.Writer, cond func(context.Context) (bool, error)) error {
	if p.Timeout <= 0 {
		return errors.New("a wait needs a positive timeout")
	}
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	t := time.NewTicker(p.interval())
	defer t.Stop()
	lastRetried := ""
	for {
		done, err := cond(ctx)
		if done {
			return nil
		}
		if err != nil {
			if end := over(ctx); end != nil {
				return end // the look failed because the wait is over: say so, not what failed
			}
			if !retryable.Error(err) {
				return err
			}
			if err.Error() != lastRetried {
				fmt.Fprintf(progress, "retrying after: %v\n", err)
				lastRetried = err.Error()
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// over is why a wait is over, or nil. A deadline that has passed ends it even before the
// context says so: the context learns it from a timer that may fire a moment after a look at
// the deadline (a timeout that is a multiple of the interval has the last tick and the deadline
// fall together), and client-go's rate limiter already refuses to send that look.
func over(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func isTimeout(err error) bool { return errors.Is(err, context.DeadlineExceeded) }
