// Package retryable tells the apiserver's answers that may differ on the next try from those
// that will not: berth's waits and writers try again only on the first. Retries keeps when a
// failed call of berth's (a clean on a host, a cloud call) goes again.
package retryable

import (
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Error tells whether err is the apiserver's timeout, throttle or own failure, or a
// connection refused, reset or cut short: a request the next try may see through.
func Error(err error) bool {
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		// client-go's rate limiter refuses a request it could not send before its deadline.
		strings.Contains(err.Error(), "client rate limiter")
}
