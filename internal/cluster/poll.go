package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
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
		switch {
		case done:
			return nil
		case err != nil && ctx.Err() == nil && !transient(err):
			return err
		case err != nil && ctx.Err() == nil && err.Error() != lastRetried:
			fmt.Fprintf(progress, "retrying after: %v\n", err)
			lastRetried = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func transient(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		// client-go's rate limiter refuses a request it could not send before the deadline;
		// the wait then ends as a timeout, not as this error.
		strings.Contains(err.Error(), "client rate limiter")
}

func isTimeout(err error) bool { return errors.Is(err, context.DeadlineExceeded) }
