package ibmp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM-Cloud/power-go-client/power/models"
	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/go-openapi/runtime"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/ibmiam"
)

// How power-go-client reports a failed call: the generated client answers each status the
// API declares for an operation with its own type (PcloudPvminstancesPostConflict, ...), all
// with Code() and a payload of Power VS's error body {code, description, error, message};
// a status it does not declare (429 for every operation here, 503) comes as a
// *runtime.APIError; the clients/instance layer wraps both with %w, except that it turns a
// 429 into a bare "Rate Limited" error. IAM's refusals come as *core.AuthenticationError.
// The status and Retry-After are therefore also recorded from the wire (exchange), which is
// the only place Retry-After survives.

// apiError is a failed Power VS call with its HTTP status, kept inside the cloud.Error so
// Launch can tell a name conflict from other failures.
type apiError struct {
	status int
	err    error
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

// statusOf is the HTTP status of a failed Power VS call, or 0.
func statusOf(err error) int {
	var e *apiError
	if errors.As(err, &e) {
		return e.status
	}
	return 0
}

// classify turns a failed call into a typed error that names the workspace and never the
// key or a token.
func (p *Provider) classify(op string, err error, rec *exchange) *cloud.Error {
	var authErr *core.AuthenticationError
	if errors.As(err, &authErr) {
		status := 0
		if authErr.HTTPProblem != nil && authErr.Response != nil {
			status = authErr.Response.StatusCode
		}
		e := &cloud.Error{Op: op, Err: fmt.Errorf("IBM Cloud IAM (%s) answered %d: %v", p.iamURL, status, err)}
		switch {
		case status == http.StatusTooManyRequests:
			e.Kind, e.RetryAfter = cloud.Throttled, rec.wait()
		case status >= 400 && status < 500:
			e.Kind = cloud.Auth
			e.Err = fmt.Errorf("%w (the API key is key %s of Secret %s: check that it is a valid IBM Cloud API key)", e.Err, ibmiam.APIKeyKey, p.secretName)
		default:
			e.Kind = cloud.Transient
		}
		return e
	}

	status, payload := 0, (*models.Error)(nil)
	var coded interface{ Code() int }
	var apiErr *runtime.APIError
	switch {
	case errors.As(err, &coded):
		status = coded.Code()
	case errors.As(err, &apiErr):
		status = apiErr.Code
	default:
		status = rec.status() // the 429 the instance client flattened, say
	}
	var withPayload interface{ GetPayload() *models.Error }
	if errors.As(err, &withPayload) {
		payload = withPayload.GetPayload()
	}
	if status == 0 {
		// No answer: the network, a timeout, or the caller giving up.
		return &cloud.Error{Kind: cloud.Transient, Op: op, Err: fmt.Errorf("Power VS workspace %s at %s: %w", p.ws.id, p.endpoint, err)}
	}

	text := err.Error()
	if payload != nil {
		text = strings.TrimSpace(payload.Error + ": " + payload.Description + " " + payload.Message)
	}
	e := &cloud.Error{Op: op, Err: &apiError{status: status, err: fmt.Errorf("Power VS workspace %s at %s answered %d: %s", p.ws.id, p.endpoint, status, text)}}
	lower := strings.ToLower(text)
	switch {
	case status == http.StatusTooManyRequests:
		e.Kind, e.RetryAfter = cloud.Throttled, rec.wait()
	case status >= 400 && status != 404 && strings.Contains(lower, "quota"):
		e.Kind = cloud.Quota
	case status >= 400 && status != 404 && isCapacity(lower):
		e.Kind = cloud.Capacity
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.Kind = cloud.Auth
		e.Err = fmt.Errorf("%w (check that the API key in key %s of Secret %s may manage workspace %s: it needs a Power Virtual Server service role on it)", e.Err, ibmiam.APIKeyKey, p.secretName, p.ws.crn)
	case status == http.StatusNotFound:
		e.Kind = cloud.NotFound
	case status == http.StatusRequestTimeout || status == http.StatusConflict || status >= 500:
		e.Kind = cloud.Transient
	default:
		e.Kind = cloud.BadConfig
	}
	return e
}

// isCapacity tells the words Power VS uses when the workspace's data center cannot place a
// VM of the asked size now (not enough cores or memory in the system pool).
func isCapacity(text string) bool {
	for _, w := range []string{"insufficient", "not enough", "no valid host", "capacity"} {
		if strings.Contains(text, w) {
			return true
		}
	}
	return false
}

// exchange records the last response of one call; recordingTransport fills it in.
type exchange struct {
	mu         sync.Mutex
	code       int
	retryAfter string
}

type exchangeKey struct{}

func withExchange(ctx context.Context, rec *exchange) context.Context {
	return context.WithValue(ctx, exchangeKey{}, rec)
}

func (x *exchange) status() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.code
}

// wait is the Retry-After of the last response, in either of its forms, seconds or a date.
func (x *exchange) wait() time.Duration {
	x.mu.Lock()
	v := strings.TrimSpace(x.retryAfter)
	x.mu.Unlock()
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(min(max(secs, 0), 3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && time.Until(t) > 0 {
		return time.Until(t)
	}
	return 0
}

type recordingTransport struct{ next http.RoundTripper }

func (t recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if rec, ok := req.Context().Value(exchangeKey{}).(*exchange); ok && resp != nil {
		rec.mu.Lock()
		rec.code, rec.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
		rec.mu.Unlock()
	}
	return resp, err
}
