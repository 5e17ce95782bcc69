package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The first component to stop while the stack runs is the run's failure: named, with its
// reason and the end of its log, and it ends the guarded context with itself as the cause.
func TestSupervisorFirstStopFailsTheRun(t *testing.T) {
	log := filepath.Join(t.TempDir(), "etcd.log")
	var lines []string
	for i := 1; i <= 20; i++ {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	if err := os.WriteFile(log, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := NewSupervisor()
	ctx, cancel := s.Guard(context.Background())
	defer cancel()
	etcd, sshd := make(chan struct{}), make(chan struct{})
	s.Watch(Component{Name: "etcd", Done: etcd, Exit: func() error { return errors.New("exit status 2") }, Log: log})
	s.Watch(Component{Name: "sshd of berth-host-1", Done: sshd})

	close(etcd)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the guarded context did not end when etcd stopped")
	}
	var failed *ComponentError
	if !errors.As(context.Cause(ctx), &failed) || failed.Component != "etcd" {
		t.Fatalf("cause %v; want etcd's stop", context.Cause(ctx))
	}
	if got := failed.Error(); got != "etcd: exit status 2" {
		t.Errorf("error %q", got)
	}
	if want := strings.Join(lines[10:], "\n"); failed.LogTail != want {
		t.Errorf("log tail %q, want the last 10 lines %q", failed.LogTail, want)
	}
	if d := failed.Details(); !strings.Contains(d, "last lines of "+log) || !strings.Contains(d, "    line 20") {
		t.Errorf("details lack the log's path and end:\n%s", d)
	}

	// What follows from the first stop is not the run's failure.
	close(sshd)
	time.Sleep(50 * time.Millisecond)
	if got := s.Err(); got != failed {
		t.Errorf("failure %v after a second stop; want the first, etcd's", got)
	}
}

// Components stopped on purpose are not failures: one forgotten while the stack runs (a
// controller a test stops), and all of them once the stack is torn down.
func TestSupervisorStopsOnPurposeAreNoFailures(t *testing.T) {
	s := NewSupervisor()
	controller, etcd := make(chan struct{}), make(chan struct{})
	forget := s.Watch(Component{Name: ControllerComponent, Done: controller})
	s.Watch(Component{Name: "etcd", Done: etcd})

	forget()
	close(controller)
	s.Stop()
	close(etcd)
	time.Sleep(50 * time.Millisecond)
	if err := s.Err(); err != nil {
		t.Fatalf("failure %v; want none", err)
	}
	select {
	case <-s.Failed():
		t.Fatal("Failed closed without a failure")
	default:
	}
}

// A guarded context that ends with its parent (Ctrl-C) has the parent's cause, not a failure.
func TestSupervisorGuardEndsWithItsParent(t *testing.T) {
	s := NewSupervisor()
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel := s.Guard(parent)
	defer cancel()
	stop()
	<-ctx.Done()
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
		t.Fatalf("cause %v, want context.Canceled", cause)
	}
	var failed *ComponentError
	if errors.As(context.Cause(ctx), &failed) {
		t.Fatalf("a Ctrl-C reads as %s's failure", failed.Component)
	}
}
