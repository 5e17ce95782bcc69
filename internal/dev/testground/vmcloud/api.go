//go:build linux

package vmcloud

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Error codes of the API, each with its one HTTP status.
const (
	codeBadRequest   = "BadRequest"           // 400
	codeUnauthorized = "Unauthorized"         // 401
	codeQuota        = "QuotaExceeded"        // 403
	codeNotFound     = "NotFound"             // 404
	codeThrottled    = "Throttled"            // 429
	codeCapacity     = "InsufficientCapacity" // 503
)

// apiError is a failed call's answer.
type apiError struct {
	status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// wireInstance is an instance as the API shows it.
type wireInstance struct {
	ID      string `json:"id"`
	Token   string `json:"token"`
	Name    string `json:"name,omitempty"`
	State   State  `json:"state"`
	Address string `json:"address,omitempty"`
	// HostKey is the VM's SSH host key in authorized_keys form, while it runs.
	HostKey      string            `json:"host_key,omitempty"`
	Tags         map[string]string `json:"tags,omitempty"`
	LaunchedAt   time.Time         `json:"launched_at"`
	TerminatedAt *time.Time        `json:"terminated_at,omitempty"`
	StateReason  string            `json:"state_reason,omitempty"`
}

func toWire(inst Instance) wireInstance {
	w := wireInstance{
		ID:          inst.ID,
		Token:       inst.Token,
		Name:        inst.Name,
		State:       inst.State,
		Address:     inst.Address,
		Tags:        inst.Tags,
		LaunchedAt:  inst.LaunchedAt,
		StateReason: inst.Reason,
	}
	if inst.HostKey != nil {
		w.HostKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(inst.HostKey)))
	}
	if !inst.TerminatedAt.IsZero() {
		t := inst.TerminatedAt
		w.TerminatedAt = &t
	}
	return w
}

type launchRequest struct {
	Token string            `json:"token"`
	Name  string            `json:"name"`
	Tags  map[string]string `json:"tags"`
}

type listAnswer struct {
	Instances []wireInstance `json:"instances"`
}

const (
	maxBody     = 1 << 20
	maxTokenLen = 128
)

func (c *Cloud) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/instances", c.serveLaunch)
	mux.HandleFunc("GET /v1/instances", c.serveList)
	mux.HandleFunc("GET /v1/instances/{id}", c.serveGet)
	mux.HandleFunc("DELETE /v1/instances/{id}", c.serveTerminate)
	return c.guard(mux)
}

// guard refuses calls without the API key, then those an armed Throttle takes.
func (c *Cloud) guard(next http.Handler) http.Handler {
	want := []byte("Bearer " + c.opts.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="vmcloud"`)
			if len(got) == 0 {
				writeError(w, errorf(http.StatusUnauthorized, codeUnauthorized, "no API key: send Authorization: Bearer <key>"))
			} else {
				writeError(w, errorf(http.StatusUnauthorized, codeUnauthorized, "the API key is not valid"))
			}
			return
		}
		c.mu.Lock()
		throttled := c.throttles > 0
		retryAfter := c.throttleAfter
		if throttled {
			c.throttles--
		}
		c.mu.Unlock()
		if throttled {
			secs := int64((retryAfter + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			writeError(w, errorf(http.StatusTooManyRequests, codeThrottled, "request rate exceeded; retry after %d s", secs))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		next.ServeHTTP(w, r)
	})
}

func (c *Cloud) serveLaunch(w http.ResponseWriter, r *http.Request) {
	var req launchRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, errorf(http.StatusBadRequest, codeBadRequest, "the body is not a launch request: %v", err))
		return
	}
	if req.Token == "" || len(req.Token) > maxTokenLen {
		writeError(w, errorf(http.StatusBadRequest, codeBadRequest, "token must be 1 to %d characters", maxTokenLen))
		return
	}
	for k := range req.Tags {
		if k == "" {
			writeError(w, errorf(http.StatusBadRequest, codeBadRequest, "a tag key is empty"))
			return
		}
	}
	res := c.launch(req.Token, req.Name, req.Tags)
	switch {
	case res.err != nil:
		writeError(w, res.err)
	case res.created:
		writeJSON(w, http.StatusCreated, toWire(res.inst))
	default:
		writeJSON(w, http.StatusOK, toWire(res.inst))
	}
}

func (c *Cloud) serveGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	inst, ok := c.Instance(id)
	if !ok || inst.Vanished {
		writeError(w, errorf(http.StatusNotFound, codeNotFound, "no instance %s", id))
		return
	}
	writeJSON(w, http.StatusOK, toWire(inst))
}

func (c *Cloud) serveList(w http.ResponseWriter, r *http.Request) {
	tags := map[string]string{}
	contradictory := false // asks one key for two values, which no instance carries
	for _, kv := range r.URL.Query()["tag"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			writeError(w, errorf(http.StatusBadRequest, codeBadRequest, "tag filter %q is not key=value", kv))
			return
		}
		if old, dup := tags[k]; dup && old != v {
			contradictory = true
		}
		tags[k] = v
	}
	var found []Instance
	if !contradictory {
		c.mu.Lock()
		found = c.list(tags)
		c.mu.Unlock()
	}
	ans := listAnswer{Instances: make([]wireInstance, len(found))}
	for i, inst := range found {
		ans.Instances[i] = toWire(inst)
	}
	writeJSON(w, http.StatusOK, ans)
}

func (c *Cloud) serveTerminate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	inst, err := c.Terminate(id)
	if err != nil {
		writeError(w, errorf(http.StatusNotFound, codeNotFound, "no instance %s (or it is gone already)", id))
		return
	}
	writeJSON(w, http.StatusOK, toWire(inst))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, e)
}
