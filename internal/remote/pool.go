package remote

import (
	"context"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// Pool keeps SSH connections open between jobs on the same host, so that a burst of tasks on a
// host pays one handshake, not one per build user. A Target with a Pool takes its connection
// from it in Dial and gives it back in Close. A connection is only reused for the same address,
// admin user, admin key and pinned host key it was opened (and verified) with.
type Pool struct {
	idleTimeout time.Duration
	maxIdle     int
	mu          sync.Mutex
	idle        map[string][]*ssh.Client
	closed      bool
}

// NewPool keeps up to maxIdle idle connections per host, each for at most idleTimeout.
func NewPool(idleTimeout time.Duration, maxIdle int) *Pool {
	return &Pool{idleTimeout: idleTimeout, maxIdle: max(1, maxIdle), idle: map[string][]*ssh.Client{}}
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
		conn := conns[len(conns)-1]
		p.idle[key] = conns[:len(conns)-1]
		p.mu.Unlock()
		if alive(ctx, conn) {
			return conn
		}
		conn.Close()
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
	p.idle[key] = append(p.idle[key], conn)
	p.mu.Unlock()
	time.AfterFunc(p.idleTimeout, func() { p.expire(key, conn) })
}

// expire closes conn if it is still idle.
func (p *Pool) expire(key string, conn *ssh.Client) {
	p.mu.Lock()
	conns := p.idle[key]
	for i, c := range conns {
		if c == conn {
			p.idle[key] = append(conns[:i:i], conns[i+1:]...)
			p.mu.Unlock()
			conn.Close()
			return
		}
	}
	p.mu.Unlock()
}

// Close closes every idle connection; connections in use are closed when given back.
func (p *Pool) Close() {
	p.mu.Lock()
	all := p.idle
	p.idle, p.closed = map[string][]*ssh.Client{}, true
	p.mu.Unlock()
	for _, conns := range all {
		for _, c := range conns {
			c.Close()
		}
	}
}
