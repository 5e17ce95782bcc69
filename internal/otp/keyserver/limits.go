package keyserver

import (
	"container/list"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits bound what one source (a client's IP address) may ask of the key server, and how many
// redemptions of all sources together may be at the apiserver at once. Every POST passes a
// source's limits before its body is read; a request past one is answered 429 with
// Retry-After. A task redeems its token once, so a source that asks more often than a handful
// of times a second is not a task. docs/otp.md explains each default.
type Limits struct {
	// SourceRate is the requests per second one source may send, SourceBurst how many it may
	// send at once above that.
	SourceRate  float64
	SourceBurst int
	// SourceConcurrency is how many requests of one source may be served at the same time.
	SourceConcurrency int
	// Sources is how many sources are remembered. Past it, the one heard from least recently
	// is forgotten (and starts afresh when it comes back), so a flood from many addresses
	// costs a bounded table.
	Sources int
	// Concurrency is how many redemptions of all sources together may be at the apiserver at
	// once, shared in turns by the namespaces of their tasks (Turns): past it a redemption
	// waits for its namespace's turn rather than being refused, so one tenant cannot use the
	// slots up for the others.
	Concurrency int
}

// DefaultLimits are the limits a server gets without flags.
func DefaultLimits() Limits {
	return Limits{SourceRate: 5, SourceBurst: 20, SourceConcurrency: 8, Sources: 4096, Concurrency: 64}
}

// Limiter applies Limits. Its zero value is not usable: make one with NewLimiter.
type Limiter struct {
	o   Limits
	now func() time.Time

	mu      sync.Mutex
	sources map[string]*list.Element // of *source, most recently heard first
	lru     *list.List
}

type source struct {
	addr     string
	bucket   *rate.Limiter
	inFlight int
}

// NewLimiter applies o's per-source fields; one that is zero or negative takes its default.
// Concurrency is not the limiter's: NewTurns takes it.
func NewLimiter(o Limits) *Limiter {
	d := DefaultLimits()
	if o.SourceRate <= 0 {
		o.SourceRate = d.SourceRate
	}
	if o.SourceBurst <= 0 {
		o.SourceBurst = d.SourceBurst
	}
	if o.SourceConcurrency <= 0 {
		o.SourceConcurrency = d.SourceConcurrency
	}
	if o.Sources <= 0 {
		o.Sources = d.Sources
	}
	return &Limiter{o: o, now: time.Now, sources: map[string]*list.Element{}, lru: list.New()}
}

// Why a request was turned away (the label of berth_otp_throttled_total).
const (
	throttledSourceRate        = "source-rate"
	throttledSourceConcurrency = "source-concurrency"
)

// Admit lets a request of addr in, or tells why not and when to come back. A request let in
// must call release when it is answered.
func (l *Limiter) Admit(addr string) (release func(), refused string, retryAfter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	src := l.sourceOf(addr)
	if src.inFlight >= l.o.SourceConcurrency {
		return nil, throttledSourceConcurrency, time.Second
	}
	r := src.bucket.ReserveN(now, 1)
	if delay := r.DelayFrom(now); delay > 0 {
		// Not taken: a refused request must not push the source's next chance further away,
		// or a client retrying on time would never get in.
		r.CancelAt(now)
		return nil, throttledSourceRate, delay
	}
	src.inFlight++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			src.inFlight--
			l.mu.Unlock()
		})
	}, "", 0
}

// sourceOf finds addr's entry, or makes it, forgetting the least recently heard source when
// the table is full. A forgotten source with requests in flight keeps its count on its own
// entry (release finds it).
func (l *Limiter) sourceOf(addr string) *source {
	if e, ok := l.sources[addr]; ok {
		l.lru.MoveToFront(e)
		return e.Value.(*source)
	}
	for l.lru.Len() >= l.o.Sources {
		oldest := l.lru.Back()
		l.lru.Remove(oldest)
		delete(l.sources, oldest.Value.(*source).addr)
	}
	src := &source{addr: addr, bucket: rate.NewLimiter(rate.Limit(l.o.SourceRate), l.o.SourceBurst)}
	l.sources[addr] = l.lru.PushFront(src)
	return src
}

// Len is how many sources the limiter remembers.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}

// sourceAddr is the IP address a request comes from: its connection's peer. Headers such as
// X-Forwarded-For are never believed: anyone can send them, and no proxy stands in front.
func sourceAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// retryAfter is a Retry-After value: whole seconds, at least one.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}
