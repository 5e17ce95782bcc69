package remote

import (
	"context"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/utils/clock"
)

// Pool keeps SSH connections open between jobs on the same host, so that a burst of tasks on a
// host pays one handshake, not one per build user. A Target with a Pool takes its connection
// from it in Dial and gives it back in Close. A connection is only reused for the same address,
// admin user, admin key and pinned host key it was opened (and verified) with.
type Pool struct {
	idleTimeout time.Duration
	maxIdle     int
	mu          sync.Mutex
	idle        map[string][]*idleConn
	closed      bool
	clock       clock.WithDelayedExecution // the real one; a test's fake
}

// idleConn is a connection while it waits in the pool, with the timer of this one stay: a
// connection taken and given back again waits anew, on a timer of its own.
type idleConn struct {
	client *ssh.Client
	timer  clock.Timer
}

// NewPool keeps up to maxIdle idle connections per host, each for at most idleTimeout.
func NewPool(idleTimeout time.Duration, maxIdle int) *Pool {
	return &Pool{idleTimeout: idleTimeout, maxIdle: max(1, maxIdle), idle: map[string][]*idleConn{},
		clock: clock.RealClock{}}
}

func poolKey(t Target) string {
	key := t.User + "@" + t.hostPort() + " " + ssh.FingerprintSHA256(t.Signer.PublicKey())
	if p, ok := t.HostKeys.(Pinned); ok {
		key += " " + ssh.FingerprintSHA256(p.Key)
	}
	return key
}

// take returns an idle connection to t that still answers, or nil.
func (p *Pool) take(ctx context.Context, t Target) *ssh.Client {
	key := poolKey(t)
	for {
		p.mu.Lock()
		conns := p.idle[key]
		if len(conns) == 0 {
			p.mu.Unlock()
			return nil
		}
		e := conns[len(conns)-1]
		p.idle[key] = conns[:len(conns)-1]
		p.mu.Unlock()
		// Stopped, the timer frees its function at once instead of holding the connection
		// until the idle timeout; one that fires anyway finds its stay over (expire).
		e.timer.Stop()
		if alive(ctx, e.client) {
			return e.client
		}
		e.client.Close()
	}
}

// alive asks the host for a keepalive reply: a connection the host or the network dropped
// while idle fails here, not in the middle of a job.
func alive(ctx context.Context, conn *ssh.Client) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		_, _, err := conn.SendRequest("keepalive@openssh.com", true, nil)
		answered <- err
	}()
	select {
	case err := <-answered:
		return err == nil
	case <-ctx.Done():
		return false
	}
}

// put keeps conn for reuse, or closes it when the pool for its host is full.
func (p *Pool) put(t Target, conn *ssh.Client) {
	key := poolKey(t)
	p.mu.Lock()
	if p.closed || len(p.idle[key]) >= p.maxIdle {
		p.mu.Unlock()
		conn.Close()
		return
	}
	e := &idleConn{client: conn}
	e.timer = p.clock.AfterFunc(p.idleTimeout, func() { p.expire(key, e) })
	p.idle[key] = append(p.idle[key], e)
	p.mu.Unlock()
}

// expire closes the connection of e if that stay in the pool is not over yet: taken and given
// back since, the connection waits on a newer timer.
func (p *Pool) expire(key string, e *idleConn) {
	p.mu.Lock()
	conns := p.idle[key]
	for i, c := range conns {
		if c == e {
			p.idle[key] = append(conns[:i:i], conns[i+1:]...)
			p.mu.Unlock()
			e.client.Close()
			return
		}
	}
	p.mu.Unlock()
}

// Close closes every idle connection; connections in use are closed when given back.
func (p *Pool) Close() {
	p.mu.Lock()
	all := p.idle
	p.idle, p.closed = map[string][]*idleConn{}, true
	p.mu.Unlock()
	for _, conns := range all {
		for _, e := range conns {
			e.timer.Stop()
			e.client.Close()
		}
	}
}
