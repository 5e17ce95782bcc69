package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Program is a program the test ground runs beside a control plane's apiserver
// (kube-controller-manager here, Tekton, kube-scheduler and kwok in realtekton): its output in
// a log file, in a process group of its own, as envtest gives kube-apiserver and etcd, so that
// a Ctrl-C at the terminal reaches only its owner, which then stops it in order.
type Program struct {
	Name   string // the file's base name
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error // how it exited, once exited is closed
}

// StartProgram runs path with args and, beside this process's environment, env; its output goes
// to logPath.
func StartProgram(path, logPath string, args, env []string) (*Program, error) {
	name := filepath.Base(path)
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Program{Name: name, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Exited reports an exit that came before Stop, with the end of the log; nil while it runs.
func (p *Program) Exited() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited before it was stopped (%v):\n%s", p.Name, p.err, p.LogTail(20))
	default:
		return nil
	}
}

// Stop ends the program: SIGTERM, then SIGKILL after wait (at once if wait is 0, for a
// program that answers SIGTERM by waiting for clients that are not there). An exit before it
// was asked to is an error: until then, whatever needed it ran without it.
func (p *Program) Stop(wait time.Duration) error {
	early := p.Exited()
	if early == nil {
		if wait > 0 {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		select {
		case <-p.exited:
		case <-time.After(wait):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	return errors.Join(early, p.log.Close())
}

// LogPath is where its output goes.
func (p *Program) LogPath() string { return p.log.Name() }

// LogTail is up to the last n lines of its log.
func (p *Program) LogTail(n int) string { return tail(p.log.Name(), n) }

// Process is the program as Processes lists it, for an owner that watches it.
func (p *Program) Process() Process {
	return Process{Name: p.Name, LogPath: p.LogPath(), done: p.exited, err: func() error { return p.err }}
}
