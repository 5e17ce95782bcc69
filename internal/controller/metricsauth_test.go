package controller

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// The tokens the fake apiserver knows; any other is made up.
const (
	scraperToken = "scraper-token"
	tenantToken  = "tenant-token"
	failingToken = "failing-token" // the apiserver cannot review it (503)
	scraperUser  = "system:serviceaccount:monitoring:prometheus-k8s"
	tenantUser   = "system:serviceaccount:tenant:default"
)

// fakeReviewer answers TokenReviews and SubjectAccessReviews as an apiserver does
// (authentication.k8s.io/v1, authorization.k8s.io/v1) and counts them.
type fakeReviewer struct {
	t                                        *testing.T
	tokenReviews, accessReviews, failedTries atomic.Int64
}

func (f *fakeReviewer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
		f.tokenReviews.Add(1)
		var review authenticationv1.TokenReview
		f.decode(r, &review)
		switch review.Spec.Token {
		case scraperToken:
			review.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: scraperUser, Groups: []string{"system:serviceaccounts"}}}
		case tenantToken:
			review.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: tenantUser}}
		case failingToken:
			f.failedTries.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
				Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable, Message: "etcd is unavailable"})
			return
		default:
			// What kube-apiserver says of a token no authenticator knows.
			review.Status = authenticationv1.TokenReviewStatus{Error: "[invalid bearer token, token lookup failed]"}
		}
		review.Kind, review.APIVersion = "TokenReview", "authentication.k8s.io/v1"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	case r.Method == http.MethodPost && r.URL.Path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		f.accessReviews.Add(1)
		var review authorizationv1.SubjectAccessReview
		f.decode(r, &review)
		na := review.Spec.NonResourceAttributes
		review.Status.Allowed = review.Spec.User == scraperUser && na != nil && na.Path == "/metrics" && na.Verb == "get"
		review.Kind, review.APIVersion = "SubjectAccessReview", "authorization.k8s.io/v1"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	default:
		http.NotFound(w, r)
	}
}

// decode reads a review in whichever encoding client-go sent it (protobuf or JSON).
func (f *fakeReviewer) decode(r *http.Request, into runtime.Object) {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		_, _, err = scheme.Codecs.UniversalDeserializer().Decode(body, nil, into)
	}
	if err != nil {
		f.t.Errorf("a review sent to the apiserver: %v", err)
	}
}

func (f *fakeReviewer) reviews() int64 { return f.tokenReviews.Load() + f.accessReviews.Load() }

// countingTransport stands for the manager's HTTP client, which the filter must not use.
type countingTransport struct{ uses atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.uses.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

func randomToken(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// A flood of made-up bearer tokens at /metrics, concurrent and in sequence, costs the apiserver
// at most the review budget (defaultReviewBurst + defaultReviewQPS a second) and writes about one error line
// a minute; a token the apiserver cannot review is not asked about on every request; the
// scraper keeps reading the metrics and a tenant's real token is refused; the manager's client
// is never used.
func TestMetricsMadeUpTokensCostABoundedNumberOfReviews(t *testing.T) {
	start := time.Now()
	api := &fakeReviewer{t: t}
	apiserver := httptest.NewServer(api)
	defer apiserver.Close()

	m, err := metricsOptions(Options{MetricsAddress: "127.0.0.1:0", MetricsSecure: true})
	if err != nil {
		t.Fatal(err)
	}
	manager := &countingTransport{}
	// The manager's own client limits (internal/cli: --kube-api-qps 500, --kube-api-burst 1,000).
	filter, err := m.FilterProvider(&rest.Config{Host: apiserver.URL, QPS: 500, Burst: 1000}, &http.Client{Transport: manager})
	if err != nil {
		t.Fatal(err)
	}
	var logLines atomic.Int64
	log := funcr.New(func(_, _ string) { logLines.Add(1) }, funcr.Options{})
	handler, err := filter(log, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "berth_build_info 1\n")
	}))
	if err != nil {
		t.Fatal(err)
	}
	metrics := httptest.NewServer(handler)
	defer metrics.Close()
	client := metrics.Client()
	scrape := func(token string) int {
		req, err := http.NewRequest(http.MethodGet, metrics.URL+"/metrics", nil)
		if err != nil {
			t.Error(err)
			return 0
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}

	if code := scrape(scraperToken); code != http.StatusOK {
		t.Fatalf("the scraper's token got %d, want 200", code)
	}
	if code := scrape(tenantToken); code != http.StatusForbidden {
		t.Errorf("a tenant's token got %d, want 403", code)
	}

	for range 20 {
		if code := scrape(failingToken); code == http.StatusOK {
			t.Fatal("a token the apiserver could not review read the metrics")
		}
	}
	if n := api.failedTries.Load(); n != 1 {
		t.Errorf("20 requests with a token whose review fails made %d reviews of it, want 1 (remembered for %s)", n, errorTTL)
	}

	refused := func(code int) bool { return code == http.StatusUnauthorized || code == http.StatusTooManyRequests }
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for range 20 {
				if code := scrape(randomToken(t)); !refused(code) {
					t.Errorf("a made-up token got %d, want 401 or 429", code)
				}
			}
		})
	}
	wg.Wait()
	for range 1000 {
		if code := scrape(randomToken(t)); !refused(code) {
			t.Errorf("a made-up token got %d, want 401 or 429", code)
		}
	}
	elapsed := time.Since(start)

	bound := int64(defaultReviewBurst + defaultReviewQPS*int(elapsed/time.Second+1))
	t.Logf("2,000 made-up tokens and %d other requests in %s: %d TokenReviews, %d SubjectAccessReviews, %d log lines",
		22, elapsed.Round(time.Millisecond), api.tokenReviews.Load(), api.accessReviews.Load(), logLines.Load())
	if n := api.reviews(); n > bound {
		t.Errorf("%d reviews in %s, want at most %d (%d at once, %d a second)", n, elapsed.Round(time.Millisecond), bound, defaultReviewBurst, defaultReviewQPS)
	}
	if n, most := logLines.Load(), int64(1+elapsed/errLogInterval); n > most {
		t.Errorf("%d log lines in %s, want at most %d (one per %s)", n, elapsed.Round(time.Millisecond), most, errLogInterval)
	}

	before := api.reviews()
	if code := scrape(scraperToken); code != http.StatusOK {
		t.Errorf("after the flood the scraper's token got %d, want 200", code)
	}
	if n := api.reviews() - before; n != 0 {
		t.Errorf("the scraper's next scrape made %d reviews, want 0 (its answers are kept)", n)
	}
	if n := manager.uses.Load(); n != 0 {
		t.Errorf("the filter sent %d requests through the manager's client, want its own", n)
	}
}

// The budget is the operator's (--metrics-review-qps, --metrics-review-burst): a smaller one
// holds a flood of made-up tokens to it, and the scraper that came first still reads.
func TestMetricsReviewBudgetIsTheOperators(t *testing.T) {
	api := &fakeReviewer{t: t}
	apiserver := httptest.NewServer(api)
	defer apiserver.Close()
	// One review a thousand seconds after a burst of three: the flood meets the burst only.
	m, err := metricsOptions(Options{MetricsAddress: "127.0.0.1:0", MetricsSecure: true, MetricsReviewQPS: 0.001, MetricsReviewBurst: 3})
	if err != nil {
		t.Fatal(err)
	}
	filter, err := m.FilterProvider(&rest.Config{Host: apiserver.URL}, &http.Client{Transport: &countingTransport{}})
	if err != nil {
		t.Fatal(err)
	}
	handler, err := filter(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "berth_build_info 1\n")
	}))
	if err != nil {
		t.Fatal(err)
	}
	metrics := httptest.NewServer(handler)
	defer metrics.Close()
	scrape := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, metrics.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := metrics.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := scrape(scraperToken); code != http.StatusOK {
		t.Fatalf("the scraper's token got %d, want 200", code)
	}
	for range 200 {
		if code := scrape(randomToken(t)); code != http.StatusUnauthorized && code != http.StatusTooManyRequests {
			t.Fatalf("a made-up token got %d, want 401 or 429", code)
		}
	}
	if n := api.reviews(); n > 3 {
		t.Errorf("200 made-up tokens made %d reviews with a budget of 3 at once and one in 1,000 s; want at most 3", n)
	}
	if code := scrape(scraperToken); code != http.StatusOK {
		t.Errorf("after the flood the scraper's token got %d, want 200", code)
	}
}
