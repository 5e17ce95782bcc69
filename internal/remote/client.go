package remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// DefaultDialTimeout bounds connecting and the SSH handshake when a Target sets none.
const DefaultDialTimeout = 15 * time.Second

// Target is a host and how to log in to it.
type Target struct {
	// Address is an IP or DNS name, with :port unless it is 22.
	Address string
	User    string
	Signer  ssh.Signer
	// HostKeys decides whether the key the host presents is the host's.
	HostKeys HostKeys
	// DialTimeout bounds connecting and the handshake; DefaultDialTimeout when zero.
	DialTimeout time.Duration
	// Pool, if set, lends an open connection to the host instead of dialing anew.
	Pool *Pool
}

func (t Target) hostPort() string {
	if _, _, err := net.SplitHostPort(t.Address); err == nil {
		return t.Address
	}
	return net.JoinHostPort(t.Address, "22")
}

// UnreachableError says a host could not be reached or did not complete the SSH handshake in
// time; berth treats the host as failed for this task and tries another.
type UnreachableError struct {
	Host string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("host %s is unreachable over SSH: %v", e.Host, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// NeverReached tells whether err says a host was never logged in to (unreachable, its host key
// not the one known, or berth's login refused): then nothing can have happened on it. Every
// command runs on a connection of its own (Dial), so a refused login means no command of that
// operation ran.
func NeverReached(err error) bool {
	var unreachable *UnreachableError
	var login *LoginError
	return errors.As(err, &unreachable) || errors.As(err, &login) || IsHostKeyChanged(err)
}

// LoginError says a host answered but berth's login to it failed (its key refused, or no
// algorithm in common): a fault of the host or of berth's config for it, never of a build user.
type LoginError struct {
	Host, User string
	Err        error
}

func (e *LoginError) Error() string { return fmt.Sprintf("ssh %s@%s: %v", e.User, e.Host, e.Err) }

func (e *LoginError) Unwrap() error { return e.Err }

// Client is an SSH connection to one host.
type Client struct {
	conn   *ssh.Client
	target Target
	// broken is set when the connection may be unusable; it is then closed, not pooled.
	broken bool
}

// Dial connects and authenticates, verifying the host key. It never takes longer than the
// target's DialTimeout or ctx's deadline, whichever is sooner.
func Dial(ctx context.Context, t Target) (*Client, error) {
	if t.HostKeys == nil {
		return nil, errors.New("remote: no host key policy: refusing to connect without verifying the host")
	}
	if t.Pool != nil {
		if conn := t.Pool.take(ctx, t); conn != nil {
			return &Client{conn: conn, target: t}, nil
		}
	}
	timeout := t.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := t.hostPort()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &UnreachableError{Host: t.Address, Err: err}
	}
	// The handshake reads from conn; a deadline makes a host that accepts TCP but never
	// speaks SSH fail in time too.
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	var keyErr error
	cfg := &ssh.ClientConfig{
		User: t.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(t.Signer)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			keyErr = t.HostKeys.Check(ctx, t.Address, key)
			return keyErr
		},
		Timeout: timeout,
	}
	sshConn, chans, reqs, err := ssh.NewClientConn(conn, addr, cfg)
	if err != nil {
		conn.Close()
		if keyErr != nil {
			return nil, keyErr
		}
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() || errors.Is(err, io.EOF) {
			return nil, &UnreachableError{Host: t.Address, Err: err}
		}
		return nil, &LoginError{Host: t.Address, User: t.User, Err: err}
	}
	_ = conn.SetDeadline(time.Time{})
	return &Client{conn: ssh.NewClient(sshConn, chans, reqs), target: t}, nil
}

// Close closes the connection, or gives it back to the target's pool.
func (c *Client) Close() error {
	if c.target.Pool != nil && !c.broken {
		c.target.Pool.put(c.target, c.conn)
		return nil
	}
	return c.conn.Close()
}

// RemoteError is a command that ran on the host and failed.
type RemoteError struct {
	Host     string
	Command  string
	ExitCode int
	Stderr   string
}

func (e *RemoteError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	return fmt.Sprintf("on host %s, %s exited %d: %s", e.Host, e.Command, e.ExitCode, msg)
}

// Run runs a command line (build it with Command or Script) with stdin and returns its
// standard output. name describes the command in errors. Cancelling ctx ends the session.
func (c *Client) Run(ctx context.Context, name, command string, stdin []byte) ([]byte, error) {
	session, err := c.conn.NewSession()
	if err != nil {
		c.broken = true
		return nil, fmt.Errorf("ssh %s: new session: %w", c.target.Address, err)
	}
	defer session.Close()
	var stdout, stderr bytes.Buffer
	session.Stdout, session.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	go func() { done <- runWith(session, command, stdin) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		c.broken = true
		_ = session.Signal(ssh.SIGKILL)
		session.Close()
		return nil, fmt.Errorf("on host %s, %s: %w", c.target.Address, name, ctx.Err())
	}
	var exit *ssh.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.Bytes(), &RemoteError{Host: c.target.Address, Command: name, ExitCode: exit.ExitStatus(), Stderr: stderr.String()}
	case err != nil:
		c.broken = true
		return stdout.Bytes(), fmt.Errorf("on host %s, %s: %w", c.target.Address, name, err)
	}
	return stdout.Bytes(), nil
}

// runWith runs command in session with stdin, if any. stdin goes straight into the channel:
// given as session.Stdin, the library would copy it through a pipe with a buffer of 32 KiB
// per session.
func runWith(session *ssh.Session, command string, stdin []byte) error {
	var in io.WriteCloser
	if stdin != nil {
		var err error
		if in, err = session.StdinPipe(); err != nil {
			return err
		}
	}
	if err := session.Start(command); err != nil {
		return err
	}
	var werr error
	if in != nil {
		_, werr = in.Write(stdin)
		if err := in.Close(); werr == nil && err != io.EOF {
			werr = err
		}
	}
	if err := session.Wait(); err != nil {
		return err // how the command ended says more than a stdin it left unread
	}
	return werr
}
