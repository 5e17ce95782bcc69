// Package iamfake is a stand-in for IBM Cloud IAM's token endpoint, which the IBM SDKs call to
// turn an API key into a bearer token (POST /identity/token, form grant_type=
// urn:ibm:params:oauth:grant-type:apikey and apikey). It answers as IAM does: a JWT-shaped
// access token with iat and exp claims, or IAM's error body for a key it does not know. The
// stand-ins of IBM's VPC and Power VS APIs ask it whether a bearer token is one it issued.
//
// It is a test ground: only tests, the dev stack and the bench link it, never the controller.
package iamfake

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// GrantTypeAPIKey is the only grant the stand-in serves.
const GrantTypeAPIKey = "urn:ibm:params:oauth:grant-type:apikey"

// Server is a running IAM token endpoint.
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	keys     map[string]bool
	issued   map[string]time.Time // access token → expiry
	requests int
	failures int // armed 5xx answers
	lifetime time.Duration
}

// New starts a token endpoint that knows the given API keys.
func New(apiKeys ...string) *Server {
	s := &Server{keys: map[string]bool{}, issued: map[string]time.Time{}, lifetime: time.Hour}
	for _, k := range apiKeys {
		s.keys[k] = true
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// NewForTest starts an endpoint for t and closes it when t ends.
func NewForTest(t testing.TB, apiKeys ...string) *Server {
	s := New(apiKeys...)
	t.Cleanup(s.Close)
	return s
}

// URL is the endpoint's base URL; the SDKs' IAM URL setting takes it as it is.
func (s *Server) URL() string { return s.srv.URL }

// Close stops the endpoint.
func (s *Server) Close() { s.srv.Close() }

// RevokeAll forgets every key and token, as when an account's keys are deleted: the next
// call with a bearer token or a key is refused.
func (s *Server) RevokeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = map[string]bool{}
	s.issued = map[string]time.Time{}
}

// Fail makes the next n token requests answer 503.
func (s *Server) Fail(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = n
}

// Requests is how many token requests were made.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Valid says whether an Authorization header value carries a token this endpoint issued and
// that has not expired.
func (s *Server) Valid(authorization string) bool {
	tok, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || tok == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.issued[tok]
	return ok && time.Now().Before(exp)
}

type tokenAnswer struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int64  `json:"expires_in"`
	Expiration   int64  `json:"expiration"`
	Scope        string `json:"scope"`
}

// errorAnswer is IAM's error body.
type errorAnswer struct {
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/identity/token" {
		writeJSON(w, http.StatusNotFound, errorAnswer{"BXNIM0102E", "no such operation: " + r.Method + " " + r.URL.Path})
		return
	}
	s.mu.Lock()
	s.requests++
	fail := s.failures > 0
	if fail {
		s.failures--
	}
	s.mu.Unlock()
	if fail {
		writeJSON(w, http.StatusServiceUnavailable, errorAnswer{"BXNIM0001E", "the service is unavailable; try again"})
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-www-form-urlencoded") {
		writeJSON(w, http.StatusBadRequest, errorAnswer{"BXNIM0109E", "Content-Type must be application/x-www-form-urlencoded, not " + ct})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, errorAnswer{"BXNIM0109E", "the form cannot be read: " + err.Error()})
		return
	}
	if g := r.PostForm.Get("grant_type"); g != GrantTypeAPIKey {
		writeJSON(w, http.StatusBadRequest, errorAnswer{"BXNIM0103E", "unsupported grant_type " + g})
		return
	}
	key := r.PostForm.Get("apikey")
	if key == "" {
		writeJSON(w, http.StatusBadRequest, errorAnswer{"BXNIM0415E", "Provided API key could not be found."})
		return
	}
	now := time.Now()
	s.mu.Lock()
	known := s.keys[key]
	var tok string
	if known {
		tok = jwt(now, now.Add(s.lifetime))
		s.issued[tok] = now.Add(s.lifetime)
	}
	s.mu.Unlock()
	if !known {
		writeJSON(w, http.StatusBadRequest, errorAnswer{"BXNIM0415E", "Provided API key could not be found."})
		return
	}
	writeJSON(w, http.StatusOK, tokenAnswer{
		AccessToken:  tok,
		RefreshToken: "not-supported",
		TokenType:    "Bearer",
		ExpiresIn:    int64(s.lifetime / time.Second),
		Expiration:   now.Add(s.lifetime).Unix(),
		Scope:        "ibm openid",
	})
}

// jwt makes an unsigned token of JWT shape: the SDKs read its iat and exp to know when to
// fetch the next one; only this endpoint checks it, by lookup.
func jwt(iat, exp time.Time) string {
	enc := base64.RawURLEncoding
	head, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	id := make([]byte, 12)
	rand.Read(id)
	claims, _ := json.Marshal(map[string]any{"iat": iat.Unix(), "exp": exp.Unix(), "jti": hex.EncodeToString(id), "iss": "iamfake"})
	return enc.EncodeToString(head) + "." + enc.EncodeToString(claims) + "." + enc.EncodeToString(id)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
