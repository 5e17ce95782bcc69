package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// A stack left running for a person must not carry on without one of its parts: a controller
// that exited, an etcd that died or an sshd that is gone would have the stack wait, silently,
// for what can no longer happen. Every component the stack starts is watched by the stack's
// Supervisor; the first one to stop unasked ends the run with a ComponentError naming it.

// ComponentError says which component of the stack stopped, or failed to start, and why.
type ComponentError struct {
	// Component is its name as the stack's progress lines give it: "etcd", "kube-apiserver",
	// "sshd of berth-host-1", "berth controller", ...
	Component string
	// Err is why, as the component said it.
	Err error
	// LogPath is the component's own log, if it keeps one; LogTail its last lines.
	LogPath, LogTail string
}

func (e *ComponentError) Error() string {
	return e.Component + ": " + e.Err.Error()
}

func (e *ComponentError) Unwrap() error { return e.Err }

// Details is the error with the end of the component's log, for a person.
func (e *ComponentError) Details() string {
	if e.LogTail == "" {
		return e.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\nlast lines of %s:", e.Error(), e.LogPath)
	for _, line := range strings.Split(e.LogTail, "\n") {
		b.WriteString("\n    " + line)
	}
	return b.String()
}

// Component is one part of the stack as the Supervisor watches it.
type Component struct {
	Name string
	// Done is closed once the component has stopped.
	Done <-chan struct{}
	// Exit says why, once Done is closed; nil if it did not say.
	Exit func() error
	// Log is the component's own log file, if it keeps one.
	Log string
}

// logTailLines is how much of a component's log goes with its failure.
const logTailLines = 10

// Supervisor watches the components of a stack. The first to stop while the stack runs is its
// failure; once Stop is called, components stop because they were told to.
type Supervisor struct {
	ctx    context.Context // ends with the first failure, which is its cause
	fail   context.CancelCauseFunc
	mu     sync.Mutex
	ended  chan struct{} // closed by Stop
	failed *ComponentError
}

// NewSupervisor returns a supervisor watching nothing yet.
func NewSupervisor() *Supervisor {
	ctx, fail := context.WithCancelCause(context.Background())
	return &Supervisor{ctx: ctx, fail: fail, ended: make(chan struct{})}
}

// Watch supervises c until Stop, or until the returned forget is called: a component stopped
// on purpose while the stack runs (a controller restarted by a test) is forgotten first.
func (s *Supervisor) Watch(c Component) (forget func()) {
	forgotten := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-c.Done:
		case <-forgotten:
			return
		case <-s.ended:
			return
		}
		select {
		case <-forgotten:
			return
		default:
		}
		var why error
		if c.Exit != nil {
			why = c.Exit()
		}
		if why == nil {
			why = errors.New("stopped")
		}
		s.Fail(failure(c, why))
	}()
	return func() { once.Do(func() { close(forgotten) }) }
}

// failure is c's stop for why, with the end of its log.
func failure(c Component, why error) *ComponentError {
	e := &ComponentError{Component: c.Name, Err: why, LogPath: c.Log}
	if c.Log != "" {
		e.LogTail = tail(c.Log, logTailLines)
	}
	return e
}

// Fail records a component's failure unless the stack is stopping or has failed already: the
// first failure is the run's, what follows from it is not.
func (s *Supervisor) Fail(e *ComponentError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.ended:
		return
	default:
	}
	if s.failed == nil {
		s.failed = e
		s.fail(e)
	}
}

// Err is the first failure, or nil.
func (s *Supervisor) Err() *ComponentError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Failed is closed at the first failure.
func (s *Supervisor) Failed() <-chan struct{} { return s.ctx.Done() }

// Guard returns a context that ends with ctx or at the stack's first failure, whose
// context.Cause is then that *ComponentError.
func (s *Supervisor) Guard(ctx context.Context) (context.Context, context.CancelFunc) {
	guarded, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	return guarded, func() {
		stop()
		cancel(context.Canceled)
	}
}

// Stop ends the supervision: from now on components stop because the stack is being torn down.
func (s *Supervisor) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.ended:
	default:
		close(s.ended)
	}
}

// tail is up to the last n lines of a file, "" if it cannot be read, each line made readable.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	lines = lines[max(0, len(lines)-n):]
	for i, line := range lines {
		lines[i] = readable(line)
	}
	return strings.Join(lines, "\n")
}

// readable turns a JSON log line (etcd's) into "time level message key=value ...", for a
// person at a terminal; any other line stays as it is.
func readable(line string) string {
	var entry map[string]any
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &entry) != nil {
		return line
	}
	var parts []string
	for _, key := range []string{"ts", "level", "msg"} {
		if v, ok := entry[key]; ok {
			parts = append(parts, fmt.Sprint(v))
			delete(entry, key)
		}
	}
	delete(entry, "caller")
	keys := make([]string, 0, len(entry))
	for k := range entry {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := json.Marshal(entry[k])
		parts = append(parts, k+"="+string(v))
	}
	return strings.Join(parts, " ")
}
