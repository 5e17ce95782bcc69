package keyserver

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/berth-ci/berth/internal/otp"
)

// Request bodies are small: a token is 43 characters, a private key a few kilobytes (an RSA
// 4096 key in OpenSSH's format is about 3.4 KB). Anything larger is refused before it is read.
const (
	maxTokenBody = 1 << 10
	maxKeyBody   = 64 << 10
)

// Handler serves the key server's endpoints:
//
//	POST /otp        body: a token; answers the key kept under it, once
//	POST /store-key  body: a private key; answers a token (authenticated callers only)
//	GET  /healthz    answers ok
type Handler struct {
	Store *Store
	// StoreKey decides who may POST /store-key; nil refuses everyone.
	StoreKey Authenticator
	// Limits, if set, bound each source's requests (429 past them).
	Limits *Limiter
	Log    logr.Logger
}

// ServeHTTP routes a request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	switch r.URL.Path {
	case "/otp":
		h.post(w, r, h.redeem)
	case "/store-key":
		h.post(w, r, h.storeKey)
	case "/healthz":
		plain(w, http.StatusOK, "ok")
	default:
		plain(w, http.StatusNotFound, "no such endpoint: the key server answers POST /otp and POST /store-key")
	}
}

func (h *Handler) post(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter, *http.Request)) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		plain(w, http.StatusMethodNotAllowed, r.URL.Path+" takes POST")
		return
	}
	if h.Limits != nil {
		release, refused, wait := h.Limits.Admit(sourceAddr(r))
		if release == nil {
			throttled.WithLabelValues(refused).Inc()
			w.Header().Set("Retry-After", retryAfter(wait))
			plain(w, http.StatusTooManyRequests, "too many requests from this address: try again after the time Retry-After says")
			return
		}
		defer release()
	}
	serve(w, r)
}

// readBody reads at most limit bytes of the body, or answers 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		plain(w, http.StatusRequestEntityTooLarge, "the request body is too large")
		return nil, false
	case err != nil:
		plain(w, http.StatusBadRequest, "the request body could not be read")
		return nil, false
	}
	return body, true
}

func (h *Handler) redeem(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, maxTokenBody)
	if !ok {
		redemptions.WithLabelValues("malformed").Inc()
		return
	}
	done, err := h.Store.Redeem(r.Context(), string(body))
	outcome, status := "redeemed", http.StatusOK
	switch {
	case err == nil:
	case errors.Is(err, otp.ErrMalformed):
		outcome, status = "malformed", http.StatusBadRequest
		err = errors.New("the request body must be the one-time token the task's secret holds (key otp), and nothing else")
	case errors.Is(err, ErrUnknown):
		outcome, status = "unknown", http.StatusNotFound
	case errors.Is(err, ErrExpired):
		outcome, status = "expired", http.StatusGone
	case errors.Is(err, ErrEnded):
		outcome, status = "ended", http.StatusGone
	case errors.Is(err, ErrBusy), errors.Is(err, ErrCrowded):
		outcome, status = "busy", http.StatusServiceUnavailable
	default:
		outcome, status = "failed", http.StatusServiceUnavailable
	}
	redemptions.WithLabelValues(outcome).Inc()
	// Never the token, never the key; the record names the task for the operator.
	log := h.Log.WithValues("outcome", outcome)
	if done.Allocation != "" {
		log = log.WithValues("allocation", done.Allocation)
	}
	switch status {
	case http.StatusOK:
		log.Info("one-time key redeemed")
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(done.Key)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
		if outcome == "busy" {
			log.Info("one-time token put off", "reason", err.Error())
			plain(w, status, err.Error())
			return
		}
		log.Error(err, "redeeming a one-time token")
		plain(w, status, "the key server cannot reach the Kubernetes API right now; the key is kept, try again")
	default:
		log.Info("one-time token refused", "reason", err.Error())
		plain(w, status, publicMessage(err))
	}
}

// publicMessage is the first line of what a refusal says: the sentinel's text, without the
// details (which record, which user) that are for the log only.
func publicMessage(err error) string {
	for _, known := range []error{ErrUnknown, ErrExpired, ErrEnded} {
		if errors.Is(err, known) {
			return known.Error()
		}
	}
	return err.Error()
}

// storeKeyLine is the line of Turns that requests to store a key wait in: each costs the
// apiserver a TokenReview and a write, and who sends it is known only after the review, so
// they take turns with the namespaces of redemptions as one more namespace ("/" is in no
// namespace's name).
const storeKeyLine = "/store-key"

func (h *Handler) storeKey(w http.ResponseWriter, r *http.Request) {
	if h.Store.Turns != nil {
		release, err := h.Store.Turns.Take(r.Context(), storeKeyLine)
		if err != nil {
			w.Header().Set("Retry-After", "1")
			plain(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		defer release()
	}
	who, err := h.authenticate(r)
	if err != nil {
		reason, status := "", http.StatusForbidden
		switch {
		case errors.Is(err, ErrStoreKeyDisabled):
			reason = "disabled"
		case errors.Is(err, ErrUnauthenticated):
			reason, status = "unauthenticated", http.StatusUnauthorized
			w.Header().Set("WWW-Authenticate", `Bearer realm="berth key server"`)
		case errors.Is(err, ErrForbidden):
			reason = "forbidden"
		default:
			h.Log.Error(err, "authenticating a caller of /store-key")
			plain(w, http.StatusServiceUnavailable, "the key server cannot check the caller's token right now; try again")
			return
		}
		storeKeyRefusals.WithLabelValues(reason).Inc()
		plain(w, status, err.Error())
		return
	}
	key, ok := readBody(w, r, maxKeyBody)
	if !ok {
		return
	}
	if len(strings.TrimSpace(string(key))) == 0 {
		plain(w, http.StatusBadRequest, "the request body must be the private key to keep")
		return
	}
	tok, err := h.Store.Put(r.Context(), key, nil, who)
	if err != nil {
		h.Log.Error(err, "keeping a key stored through /store-key", "storedBy", who)
		plain(w, http.StatusServiceUnavailable, "the key server cannot keep the key right now; try again")
		return
	}
	h.Log.Info("one-time key stored", "storedBy", who)
	plain(w, http.StatusOK, tok.String())
}

func (h *Handler) authenticate(r *http.Request) (string, error) {
	if h.StoreKey == nil {
		return "", ErrStoreKeyDisabled
	}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return h.StoreKey.Authenticate(r.Context(), strings.TrimSpace(bearer))
}

func plain(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

// writeTimeout is how long the server has to answer a request once its headers are read:
// past it the connection is cut and the client gets no answer at all.
const writeTimeout = 30 * time.Second

// Endpoint serves a Handler over HTTPS with the certificate a CertWatcher keeps current (a
// renewed certificate is served from the next connection on). It runs on every replica: a
// redemption needs no lease.
type Endpoint struct {
	// Listener, if set, is served; else Addr is listened on.
	Listener net.Listener
	Addr     string
	Certs    *certwatcher.CertWatcher
	Handler  http.Handler

	serving atomic.Bool
}

// NeedLeaderElection: every replica serves, as the Service sends requests to any of them.
func (e *Endpoint) NeedLeaderElection() bool { return false }

// Serving tells whether the endpoint accepts connections (for a readiness check).
func (e *Endpoint) Serving() bool { return e.serving.Load() }

// Start serves until ctx ends, then lets requests under way finish for a few seconds.
func (e *Endpoint) Start(ctx context.Context) error {
	ln := e.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", e.Addr); err != nil {
			return err
		}
	}
	server := &http.Server{
		Handler:   e.Handler,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: e.Certs.GetCertificate},
		// A slow client can hold a connection only briefly: both bodies are tiny.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	done := make(chan error, 1)
	go func() { done <- server.ServeTLS(ln, "", "") }()
	e.serving.Store(true)
	defer e.serving.Store(false)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return server.Shutdown(shutdown)
}
