// Package localvm is the provider for platforms of type local-vm: VMs from the local VM cloud
// (internal/dev/testground/vmcloud) that development stacks, tests and the bench run. It is a
// plain HTTP client of that cloud's API. Only berth-dev (internal/dev/devcli), the dev stack and
// tests register it; the production berth, which no such cloud serves, does not.
package localvm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/internal/cloud"
)

func init() { cloud.Register("local-vm", New) }

const (
	// apiKeyKey is the key of the platform's Secret that holds the API key.
	apiKeyKey = "api-key"
	// adminUser is who the cloud's VMs let in with the platform's key pair.
	adminUser = "root"

	callTimeout = 30 * time.Second
	// A throttled call is retried this many times while the cloud asks for short waits; a
	// longer wait, or more throttling, goes back to the caller as a Throttled error, whose
	// RetryAfter its own backoff honours.
	throttleRetries = 3
	maxInlineWait   = 5 * time.Second
	// firstThrottleBackoff is the wait when the cloud throttles without saying how long.
	firstThrottleBackoff = 100 * time.Millisecond

	maxAnswer = 4 << 20
)

// Provider talks to one local VM cloud for one platform.
type Provider struct {
	platform   string
	endpoint   *url.URL
	secretName string
	readSecret cloud.SecretReader
	client     *http.Client
}

// New builds a provider from the platform's endpoint and secret keys.
func New(s cloud.Settings) (cloud.Provider, error) {
	raw := strings.TrimSpace(s.Values["endpoint"])
	if raw == "" {
		return nil, cloud.BadKey(s.Platform, "endpoint", "required: the local VM cloud's URL, like http://127.0.0.1:8790")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, cloud.BadKey(s.Platform, "endpoint", "%q is not an http(s) URL like http://127.0.0.1:8790", raw)
	}
	secret := strings.TrimSpace(s.Values["secret"])
	if secret == "" {
		return nil, cloud.BadKey(s.Platform, "secret", "required: the Secret holding the cloud's API key under %s", apiKeyKey)
	}
	if s.Secret == nil {
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s: no way to read Secrets was given", s.Platform)
	}
	return &Provider{
		platform:   s.Platform,
		endpoint:   u,
		secretName: secret,
		readSecret: s.Secret,
		client:     &http.Client{Timeout: callTimeout},
	}, nil
}

// instanceJSON is an instance as the cloud's API shows it.
type instanceJSON struct {
	ID         string            `json:"id"`
	Token      string            `json:"token"`
	State      string            `json:"state"`
	Address    string            `json:"address"`
	Tags       map[string]string `json:"tags"`
	LaunchedAt time.Time         `json:"launched_at"`
}

type launchJSON struct {
	Token string            `json:"token"`
	Name  string            `json:"name,omitempty"`
	Tags  map[string]string `json:"tags,omitempty"`
}

type listJSON struct {
	Instances []instanceJSON `json:"instances"`
}

type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

var _ cloud.Provider = (*Provider)(nil)

func (p *Provider) Launch(ctx context.Context, req cloud.LaunchRequest) (cloud.Instance, error) {
	if req.Token == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.BadConfig, "launch", "no launch token: a launch without one could start a VM twice")
	}
	var ans instanceJSON
	err := p.call(ctx, "launch", http.MethodPost, p.endpoint.JoinPath("v1", "instances"),
		launchJSON{Token: req.Token, Name: req.Name, Tags: req.Tags}, &ans)
	if err != nil {
		return cloud.Instance{}, err
	}
	return toInstance("launch", ans)
}

func (p *Provider) Get(ctx context.Context, id string) (cloud.Instance, error) {
	if id == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.NotFound, "get", "no instance id")
	}
	var ans instanceJSON
	if err := p.call(ctx, "get", http.MethodGet, p.endpoint.JoinPath("v1", "instances", id), nil, &ans); err != nil {
		return cloud.Instance{}, err
	}
	return toInstance("get", ans)
}

func (p *Provider) List(ctx context.Context, tags map[string]string) ([]cloud.Instance, error) {
	u := p.endpoint.JoinPath("v1", "instances")
	q := url.Values{}
	for k, v := range tags {
		q.Add("tag", k+"="+v)
	}
	u.RawQuery = q.Encode()
	var ans listJSON
	if err := p.call(ctx, "list", http.MethodGet, u, nil, &ans); err != nil {
		return nil, err
	}
	out := make([]cloud.Instance, 0, len(ans.Instances))
	for _, a := range ans.Instances {
		inst, err := toInstance("list", a)
		if err != nil {
			return nil, err
		}
		if inst.State != cloud.StateGone {
			out = append(out, inst)
		}
	}
	return out, nil
}

func (p *Provider) Terminate(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	err := p.call(ctx, "terminate", http.MethodDelete, p.endpoint.JoinPath("v1", "instances", id), nil, nil)
	if cloud.KindOf(err) == cloud.NotFound {
		return nil // gone already, or never known: either way it runs no more
	}
	return err
}

func (p *Provider) AdminUser() string { return adminUser }

func toInstance(op string, a instanceJSON) (cloud.Instance, error) {
	state := cloud.State(a.State)
	switch state {
	case cloud.StatePending, cloud.StateRunning, cloud.StateGone, cloud.StateStopped:
	default:
		return cloud.Instance{}, cloud.Errorf(cloud.Transient, op, "instance %s is in state %q, which berth does not know", a.ID, a.State)
	}
	return cloud.Instance{
		ID:         a.ID,
		Token:      a.Token,
		State:      state,
		Address:    a.Address,
		Tags:       a.Tags,
		LaunchedAt: a.LaunchedAt,
	}, nil
}

// call makes one API call, retrying it while the cloud throttles briefly, and decodes a
// successful answer into out.
func (p *Provider) call(ctx context.Context, op, method string, u *url.URL, body, out any) error {
	key, err := p.apiKey(ctx, op)
	if err != nil {
		return err
	}
	var payload []byte
	if body != nil {
		if payload, err = json.Marshal(body); err != nil {
			return cloud.Errorf(cloud.BadConfig, op, "encoding the request: %v", err)
		}
	}
	for attempt := 0; ; attempt++ {
		err := p.once(ctx, op, method, u, key, payload, out)
		if cloud.KindOf(err) != cloud.Throttled || attempt == throttleRetries {
			return err
		}
		wait := cloud.RetryAfterOf(err)
		if wait == 0 {
			wait = firstThrottleBackoff << attempt
		}
		if wait > maxInlineWait {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func (p *Provider) once(ctx context.Context, op, method string, u *url.URL, key string, payload []byte, out any) error {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return cloud.Errorf(cloud.BadConfig, op, "building the request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "application/json")
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// Network trouble, a timeout or the caller giving up; the URL is in err, the key never.
		return &cloud.Error{Kind: cloud.Transient, Op: op, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return cloud.Errorf(cloud.Transient, op, "reading the answer of %s: %v", p.endpoint.Redacted(), err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(data, out); err != nil {
			return cloud.Errorf(cloud.Transient, op, "%s answered %d with something that is not the API's JSON: %v", p.endpoint.Redacted(), resp.StatusCode, err)
		}
		return nil
	}
	return p.failure(op, resp, data)
}

// failure turns an error answer into a typed error. The code in the body decides where the
// API gives one; the status decides otherwise (a proxy in between, say).
func (p *Provider) failure(op string, resp *http.Response, data []byte) error {
	var e errorJSON
	if json.Unmarshal(data, &e) != nil || e.Code == "" {
		e = errorJSON{Code: http.StatusText(resp.StatusCode), Message: strings.TrimSpace(string(data))}
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "..."
		}
	}
	kind := kindOf(e.Code, resp.StatusCode)
	err := &cloud.Error{Kind: kind, Op: op, Err: fmt.Errorf("%s answered %d %s: %s", p.endpoint.Redacted(), resp.StatusCode, e.Code, e.Message)}
	switch kind {
	case cloud.Throttled:
		err.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	case cloud.Auth:
		err.Err = fmt.Errorf("%w (the API key is key %s of Secret %s: check that it is the cloud's key)", err.Err, apiKeyKey, p.secretName)
	}
	return err
}

func kindOf(code string, status int) cloud.Kind {
	switch code {
	case "InsufficientCapacity":
		return cloud.Capacity
	case "Throttled":
		return cloud.Throttled
	case "QuotaExceeded":
		return cloud.Quota
	case "NotFound":
		return cloud.NotFound
	case "BadRequest":
		return cloud.BadConfig
	case "Unauthorized":
		return cloud.Auth
	}
	switch {
	case status == http.StatusServiceUnavailable:
		return cloud.Capacity
	case status == http.StatusTooManyRequests:
		return cloud.Throttled
	case status == http.StatusForbidden:
		return cloud.Quota
	case status == http.StatusNotFound:
		return cloud.NotFound
	case status == http.StatusUnauthorized:
		return cloud.Auth
	case status == http.StatusRequestTimeout || status == http.StatusConflict || status >= 500:
		return cloud.Transient
	case status >= 400:
		return cloud.BadConfig
	}
	return cloud.Transient // 1xx or 3xx: not what this API answers
}

// parseRetryAfter reads Retry-After in either of its forms, seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, 24*3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// apiKey reads the API key from the platform's Secret, afresh for every call, so a rotated
// key takes effect at once and none is kept in memory between calls.
func (p *Provider) apiKey(ctx context.Context, op string) (string, error) {
	creds, err := p.readSecret.Credentials(ctx, op, p.secretName, "the cloud's API key", apiKeyKey)
	if err != nil {
		return "", err
	}
	return creds[apiKeyKey], nil
}
