//go:build linux

package realtekton

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one program Start runs, its output in <name>.log in Tekton's directory.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error // how it exited, once exited is closed
	// drains: the program answers SIGTERM by waiting for clients that are not there, so stop
	// kills it outright.
	drains bool
}

func startProcess(path, dir string, args, env []string) (*process, error) {
	name := filepath.Base(path)
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, as envtest gives kube-apiserver: a Ctrl-C at the terminal is the
	// test binary's alone; what a killed test binary leaves running, the next control plane's
	// start reaps (see controlplane.RecordProcesses).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop ends the program: SIGTERM, then SIGKILL after stopWait. An exit before it was asked to
// is an error, with the end of its log.
func (p *process) stop() error {
	var early error
	select {
	case <-p.exited:
		early = fmt.Errorf("%s exited while Tekton was in use (%v):\n%s", p.name, p.err, p.logTail(20))
	default:
		if p.drains {
			_ = p.cmd.Process.Kill()
			<-p.exited
			break
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(stopWait):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	return errors.Join(early, p.log.Close())
}

// logTail is up to the last n lines of its log.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.log.Name())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-n):], []byte("\n")))
}
