// Package sshfake is an SSH server in the test process (golang.org/x/crypto/ssh on loopback)
// that accepts one admin key, records every command it is sent and answers each through a
// Handler. It stands in for hosts that cannot run here: thousands of simulated hosts for the
// bench, and Windows and macOS hosts whose tools (PowerShell, sysadminctl) this machine lacks.
// Real Linux hosts are sshhosts' job, never this package's.
package sshfake

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"

	"golang.org/x/crypto/ssh"
)

// Command is one exec request the server received.
type Command struct {
	User  string
	Line  string
	Stdin []byte
}

// Reply is what the server answers a command with.
type Reply struct {
	Stdout, Stderr string
	Exit           uint32
}

// Handler answers a command. It runs on the connection's goroutine; it must not block for long.
type Handler func(Command) Reply

// Server is one fake host.
type Server struct {
	// Address is host:port on loopback.
	Address string
	// HostKey is the server's public key, to pin.
	HostKey ssh.PublicKey

	listener net.Listener
	config   *ssh.ServerConfig
	handler  Handler
	mu       sync.Mutex
	commands []Command
	open     map[net.Conn]bool
	accepted int
	conns    sync.WaitGroup
}

// Start listens on a free loopback port and accepts user logins with the key authorized.
func Start(authorized ssh.PublicKey, handler Handler) (*Server, error) {
	return StartAt("127.0.0.1:0", authorized, handler)
}

// StartAt is Start listening on addr (host:port, port 0 for a free one): a host of its own
// loopback address (any of 127.0.0.0/8) on port 22 is reached by its bare IP, as a config
// that takes no port names it.
func StartAt(addr string, authorized ssh.PublicKey, handler Handler) (*Server, error) {
	signer, _, err := newKey()
	if err != nil {
		return nil, err
	}
	want := authorized.Marshal()
	config := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if string(key.Marshal()) != string(want) {
				return nil, errors.New("key not authorized")
			}
			return nil, nil
		},
	}
	config.AddHostKey(signer)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Address: l.Addr().String(), HostKey: signer.PublicKey(), listener: l, config: config, handler: handler}
	go s.accept()
	return s, nil
}

// Close stops listening and waits for open connections to end.
func (s *Server) Close() error {
	err := s.listener.Close()
	s.DropConnections()
	s.conns.Wait()
	return err
}

// Commands returns what the server was sent so far, in order.
func (s *Server) Commands() []Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Command(nil), s.commands...)
}

// Connections is how many connections the server has accepted so far.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// DropConnections cuts every open connection, as a host reboot or a network blip would.
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.open {
		c.Close()
	}
}

func (s *Server) accept() {
	for {
		conn, err := s.listener.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.open == nil {
			s.open = map[net.Conn]bool{}
		}
		s.open[conn] = true
		s.accepted++
		s.mu.Unlock()
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			s.serve(conn)
			s.mu.Lock()
			delete(s.open, conn)
			s.mu.Unlock()
		}()
	}
}

func (s *Server) serve(conn net.Conn) {
	defer conn.Close()
	sc, chans, reqs, err := ssh.NewServerConn(conn, s.config)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	var sessions sync.WaitGroup
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, requests, err := nc.Accept()
		if err != nil {
			continue
		}
		sessions.Add(1)
		go func() {
			defer sessions.Done()
			s.session(sc.User(), ch, requests)
		}()
	}
	sessions.Wait()
}

// session serves one exec request: read all of stdin (the client closes it after sending),
// record, answer, exit status, close. Other requests are refused, as a host with no shell for
// berth would.
func (s *Server) session(user string, ch ssh.Channel, requests <-chan *ssh.Request) {
	defer ch.Close()
	for req := range requests {
		if req.Type != "exec" {
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
			continue
		}
		line, ok := execLine(req.Payload)
		if req.WantReply {
			_ = req.Reply(ok, nil)
		}
		if !ok {
			return
		}
		stdin, _ := io.ReadAll(ch)
		cmd := Command{User: user, Line: line, Stdin: stdin}
		s.mu.Lock()
		s.commands = append(s.commands, cmd)
		s.mu.Unlock()
		reply := s.handler(cmd)
		_, _ = io.WriteString(ch, reply.Stdout)
		_, _ = io.WriteString(ch.Stderr(), reply.Stderr)
		status := make([]byte, 4)
		binary.BigEndian.PutUint32(status, reply.Exit)
		_, _ = ch.SendRequest("exit-status", false, status)
		return
	}
}

// execLine decodes an exec request's payload: one SSH string (RFC 4254 section 6.5).
func execLine(payload []byte) (string, bool) {
	if len(payload) < 4 {
		return "", false
	}
	n := binary.BigEndian.Uint32(payload)
	if uint32(len(payload)-4) != n {
		return "", false
	}
	return string(payload[4:]), true
}

// Fleet is n fake hosts sharing one admin key and one handler.
type Fleet struct {
	Servers  []*Server
	AdminKey ssh.Signer
	// AdminKeyPEM is the admin key as an OpenSSH private key, for the hosts' admin Secret.
	AdminKeyPEM []byte
}

// StartFleet starts n fake hosts on free loopback ports.
func StartFleet(n int, handler Handler) (*Fleet, error) {
	return StartFleetAt(slices.Repeat([]string{"127.0.0.1:0"}, n), handler)
}

// StartFleetAt starts a fake host listening on each address (see StartAt).
func StartFleetAt(addrs []string, handler Handler) (*Fleet, error) {
	signer, pemKey, err := newKey()
	if err != nil {
		return nil, err
	}
	f := &Fleet{AdminKey: signer, AdminKeyPEM: pemKey}
	for _, addr := range addrs {
		s, err := StartAt(addr, signer.PublicKey(), handler)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("starting fake host %d of %d: %w", len(f.Servers)+1, len(addrs), err)
		}
		f.Servers = append(f.Servers, s)
	}
	return f, nil
}

// Close stops every host of the fleet.
func (f *Fleet) Close() {
	for _, s := range f.Servers {
		_ = s.Close()
	}
}

// newKey makes an ed25519 key: a signer and its OpenSSH private key file.
func newKey() (ssh.Signer, []byte, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "berth test ground")
	if err != nil {
		return nil, nil, err
	}
	return signer, pem.EncodeToMemory(block), nil
}
