package controller

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// How the metrics filter spends the apiserver's reviews. Anyone who reaches the port can send a
// made-up token, and every token not seen before is a TokenReview; so the reviews have a budget of
// their own, apart from the manager's client (500 QPS, burst 1,000), and a request that finds it
// spent is answered 429 at once, costing nothing.
//
// The legitimate need is tiny: each scraper's token is reviewed once per tokenTTL and its
// authorization once per allowTTL, a few reviews a minute for a handful of Prometheus
// replicas. 2 reviews a second, 10 at once (a restart with every scraper arriving together),
// is well above that and under half a percent of the controller's own QPS. So 2,000 made-up
// tokens cost at most burst + QPS × (seconds the flood lasts) reviews. These are the defaults of
// --metrics-review-qps and --metrics-review-burst; an operator with many scrapers (or scrapers
// that rotate tokens often) raises them.
const (
	defaultReviewQPS   = 2
	defaultReviewBurst = 10
	// reviewTimeout is controller-runtime's TokenAccessReviewTimeout for its metrics filter.
	reviewTimeout = 10 * time.Second
)

// How long answers are kept. tokenTTL (rejections and acceptances alike), allowTTL and denyTTL
// are controller-runtime's values for its metrics filter. errorTTL is for a review the apiserver
// could not answer (an error, not a refusal): the same token or user is answered 503 without
// asking again for that long, which is shorter than a scrape interval (30s in
// config/prometheus), so a scraper caught by a passing outage is asked about again at its next
// scrape.
const (
	tokenTTL = time.Minute
	allowTTL = 5 * time.Minute
	denyTTL  = 30 * time.Second
	errorTTL = 10 * time.Second
)

// memoSize is how many failed reviews a memo keeping them for ttl must hold: only what the
// budget let through, at most burst + QPS × ttl, so the memos evict nothing in practice and
// their memory is set by the operator's budget, never by a flood. A user's authorization is
// asked only for a token accepted within tokenTTL, hence that window for users.
func memoSize(qps float32, burst int, ttl time.Duration) int {
	return burst + int(math.Ceil(float64(qps)*ttl.Seconds()))
}

// errLogInterval is how often the filter logs that reviews fail or the budget is spent: once is
// enough to tell the operator, and a flood must not write a line per request.
const errLogInterval = time.Minute

// errReviewBudgetSpent is the review client's answer when the budget has no review left now.
var errReviewBudgetSpent = errors.New("the metrics filter's budget of reviews is spent for now")

// metricsAuthFilter is the metrics server's FilterProvider: a bearer token the apiserver accepts
// (TokenReview), of a user it allows get on the path (SubjectAccessReview), reads the metrics.
// It differs from controller-runtime's filters.WithAuthenticationAndAuthorization in what a
// flood of made-up tokens costs: the reviews go through a client of their own with a small
// budget that never queues, a token the apiserver refuses is answered 401 and remembered (not
// taken for an error and logged), and a token or user whose review failed is remembered too, so
// it is not reviewed again on every request. The manager's client is not used. qps and burst are
// the budget of reviews (the defaults when zero or less).
func metricsAuthFilter(qps float32, burst int) func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	if qps <= 0 {
		qps = defaultReviewQPS
	}
	if burst <= 0 {
		burst = defaultReviewBurst
	}
	return func(c *rest.Config, _ *http.Client) (metricsserver.Filter, error) {
		return newMetricsAuth(c, qps, burst)
	}
}

func newMetricsAuth(c *rest.Config, qps float32, burst int) (metricsserver.Filter, error) {
	cfg := rest.CopyConfig(c)
	cfg.RateLimiter = nonBlocking{flowcontrol.NewTokenBucketRateLimiter(qps, burst)}
	cfg.Timeout = reviewTimeout
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the metrics filter's client: %w", err)
	}
	authn, err := authenticationclient.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("the metrics filter's TokenReview client: %w", err)
	}
	authzClient, err := authorizationclient.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("the metrics filter's SubjectAccessReview client: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authzClient,
		AllowCacheTTL:             allowTTL,
		DenyCacheTTL:              denyTTL,
		// One attempt: a retry is another review, and the scraper asks again at its next scrape.
		WebhookRetryBackoff: &wait.Backoff{Steps: 1},
	}.New()
	if err != nil {
		return nil, fmt.Errorf("the metrics filter's authorizer: %w", err)
	}
	key := make([]byte, sha256.Size)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("the metrics filter's cache key: %w", err)
	}
	a := &metricsAuth{
		// The apiserver's own token cache: it keeps acceptances and refusals by an HMAC of the
		// token, and makes one review of concurrent requests with the same token. It does not keep
		// errors; failedTokens does.
		tokens:       tokencache.New(tokenReviewer{authn.TokenReviews()}, false, tokenTTL, tokenTTL),
		authz:        authz,
		key:          key,
		failedTokens: utilcache.NewLRUExpireCache(memoSize(qps, burst, errorTTL)),
		failedUsers:  utilcache.NewLRUExpireCache(memoSize(qps, burst, tokenTTL)),
	}
	return a.filter, nil
}

// nonBlocking takes a review from the budget only if one is there now: client-go's limiter
// would otherwise queue every made-up token's review, and each scrape behind them.
type nonBlocking struct{ flowcontrol.RateLimiter }

func (n nonBlocking) Wait(context.Context) error {
	if !n.TryAccept() {
		return errReviewBudgetSpent
	}
	return nil
}

type metricsAuth struct {
	tokens authenticator.Token
	authz  authorizer.Authorizer
	// key keys the HMAC under which failedTokens remembers a token: never the token itself.
	key []byte
	// failedTokens and failedUsers remember, for errorTTL, a token whose TokenReview and a user
	// whose SubjectAccessReview failed (an error, not an answer).
	failedTokens, failedUsers *utilcache.LRUExpireCache
	errLog                    logThrottle
}

func (a *metricsAuth) filter(log logr.Logger, next http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		token, ok := bearerToken(req)
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		tokenKey := a.tokenKey(token)
		if _, failed := a.failedTokens.Get(tokenKey); failed {
			unavailable(w)
			return
		}
		res, ok, err := a.tokens.AuthenticateToken(req.Context(), token)
		switch {
		case errors.Is(err, errReviewBudgetSpent):
			// Not remembered: it cost nothing, and the scraper may be let through a second later.
			a.errLog.log(log, err, "Too many tokens to review; answering 429")
			tooMany(w)
			return
		case err != nil:
			a.failedTokens.Add(tokenKey, struct{}{}, errorTTL)
			a.errLog.log(log, err, "Could not review a bearer token at /metrics")
			unavailable(w)
			return
		case !ok:
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		// The token goes no further than this filter, as in the apiserver's own bearer
		// authenticator.
		req.Header.Del("Authorization")
		name := res.User.GetName()
		if _, failed := a.failedUsers.Get(name); failed {
			unavailable(w)
			return
		}
		decision, _, err := a.authz.Authorize(req.Context(), authorizer.AttributesRecord{
			User: res.User,
			Verb: strings.ToLower(req.Method),
			Path: req.URL.Path,
		})
		if err != nil {
			// Remembered even when the budget was spent: the authorizer logs each failure itself.
			a.failedUsers.Add(name, struct{}{}, errorTTL)
			a.errLog.log(log, err, "Could not review a user's access to /metrics", "user", name)
			unavailable(w)
			return
		}
		if decision != authorizer.DecisionAllow {
			http.Error(w, fmt.Sprintf("%s may not %s %s", name, strings.ToLower(req.Method), req.URL.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, req)
	}), nil
}

// bearerToken is the token of an "Authorization: Bearer <token>" header, as the apiserver reads
// it (k8s.io/apiserver's bearertoken authenticator).
func bearerToken(req *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(req.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	token, _, _ = strings.Cut(token, " ")
	return token, token != ""
}

func (a *metricsAuth) tokenKey(token string) string {
	h := hmac.New(sha256.New, a.key)
	h.Write([]byte(token))
	return string(h.Sum(nil))
}

func tooMany(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "Too many tokens to review; try again", http.StatusTooManyRequests)
}

func unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(int(errorTTL/time.Second)))
	http.Error(w, "The apiserver could not review the request; try again", http.StatusServiceUnavailable)
}

// tokenReviewer asks the apiserver about a token once: no retry, since a retry is another review
// and a scraper asks again at its next scrape. A token the apiserver does not accept is a
// refusal, whatever reason it gives in status.error (for a made-up token it always gives one);
// only a review that got no answer is an error.
type tokenReviewer struct {
	reviews authenticationclient.TokenReviewInterface
}

func (r tokenReviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	review, err := r.reviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("a TokenReview: %w", err)
	}
	if !review.Status.Authenticated {
		return nil, false, nil
	}
	u := review.Status.User
	groups := u.Groups
	// As k8s.io/apiserver's delegating authenticator does, so RBAC bindings to all
	// authenticated users apply.
	if !slices.Contains(groups, user.AllAuthenticated) {
		groups = append(slices.Clip(groups), user.AllAuthenticated)
	}
	var extra map[string][]string
	if len(u.Extra) > 0 {
		extra = make(map[string][]string, len(u.Extra))
		for k, v := range u.Extra {
			extra[k] = v
		}
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: u.Username, UID: u.UID, Groups: groups, Extra: extra}}, true, nil
}

// logThrottle writes at most one line per errLogInterval, with the count of those it held back.
type logThrottle struct {
	mu       sync.Mutex
	last     time.Time
	withheld int
}

func (t *logThrottle) log(log logr.Logger, err error, msg string, kv ...any) {
	t.mu.Lock()
	if !t.last.IsZero() && time.Since(t.last) < errLogInterval {
		t.withheld++
		t.mu.Unlock()
		return
	}
	withheld := t.withheld
	t.last, t.withheld = time.Now(), 0
	t.mu.Unlock()
	log.Error(err, msg, append(kv, "withheldSinceLastLine", withheld)...)
}
