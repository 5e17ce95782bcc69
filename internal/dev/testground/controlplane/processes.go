package controlplane

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
)

// A control plane's owner that keeps it for a person (`berth dev`) must notice when one of its
// programs dies: envtest says nothing once it has started them. WithLogDir gives etcd and
// kube-apiserver a pipe for their output instead of nothing; the pipe's end is the process's
// end, and what came through it is their log.

// WithLogDir keeps the logs of etcd, kube-apiserver and kube-controller-manager in dir
// (<program>.log, truncated at Start), and lets Processes watch all three.
func WithLogDir(dir string) Option {
	return func(o *options) { o.logDir = dir }
}

// Process is one program of a running control plane.
type Process struct {
	Name    string // etcd, kube-apiserver, kube-controller-manager
	LogPath string
	done    <-chan struct{}
	err     func() error
}

// Done is closed once the process has exited.
func (p Process) Done() <-chan struct{} { return p.done }

// Err says how the process exited, once Done is closed: its exit status where known.
func (p Process) Err() error {
	if err := p.err(); err != nil {
		return err
	}
	return errors.New("exited")
}

// LogTail is up to the last n lines of the process's log.
func (p Process) LogTail(n int) string { return tail(p.LogPath, n) }

// Processes are the programs that can be watched: kube-controller-manager when it runs, and,
// with WithLogDir, etcd and kube-apiserver.
func (cp *ControlPlane) Processes() []Process {
	procs := append([]Process(nil), cp.logged...)
	if cp.kcm != nil {
		procs = append(procs, cp.kcm.Process())
	}
	return procs
}

// loggedOutput is the write end of a process's output pipe, handed to envtest, and the
// process as its owner watches it.
type loggedOutput struct {
	w       *os.File
	once    sync.Once
	process Process
}

// logOutput opens dir/<name>.log and a pipe whose read end is copied into it until every
// writer is gone: the process and, until closeParentEnd, this one.
func logOutput(dir, name string) (*loggedOutput, error) {
	path := filepath.Join(dir, name+".log")
	log, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		_ = log.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(log, r)
		_ = r.Close()
		_ = log.Close()
	}()
	return &loggedOutput{w: w, process: Process{Name: name, LogPath: path, done: done, err: func() error { return nil }}}, nil
}

// closeParentEnd closes this process's copy of the write end once the child has its own, so
// that the child's exit ends the copy. Safe to call more than once.
func (l *loggedOutput) closeParentEnd() {
	l.once.Do(func() { _ = l.w.Close() })
}

// tail is up to the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-n):], []byte("\n")))
}

// killOrphanedAPIServer kills kube-apiserver at once if etcd has exited (as far as the owner
// watches them, see WithLogDir): without its storage it does not shut down gracefully, it
// waits out the whole stop timeout.
func (cp *ControlPlane) killOrphanedAPIServer() {
	for _, p := range cp.logged {
		if p.Name != "etcd" {
			continue
		}
		select {
		case <-p.Done():
		default:
			return
		}
	}
	if len(cp.logged) == 0 {
		return
	}
	me, certDir := os.Getpid(), cp.env.ControlPlane.APIServer.CertDir
	for _, pid := range processesRunningFrom(filepath.Dir(cp.env.ControlPlane.APIServer.Path)) {
		if parentPID(pid) == me && slices.Contains(tempDirsOf(pid), certDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// CPUSeconds is the CPU time (user and system) etcd and kube-apiserver have used so far, by
// name, read from /proc: each is the process whose command line names this control plane's
// data or certificate directory. A program not found is left out.
func (cp *ControlPlane) CPUSeconds() map[string]float64 {
	marks := map[string]string{
		"etcd":           "--data-dir=" + cp.env.ControlPlane.Etcd.DataDir,
		"kube-apiserver": "--cert-dir=" + cp.env.ControlPlane.APIServer.CertDir,
	}
	out := map[string]float64{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(cmdline, []byte{0})
		for name, mark := range marks {
			if len(args) > 0 && filepath.Base(string(args[0])) == name && slices.ContainsFunc(args, func(a []byte) bool { return string(a) == mark }) {
				if s, ok := ProcessCPUSeconds(pid); ok {
					out[name] = s
				}
			}
		}
	}
	return out
}

// ClockTicks is how many of the units /proc gives times in (USER_HZ, proc(5)) make a second:
// 100 on the architectures Go builds Linux binaries for, whatever the kernel's own tick.
const ClockTicks = 100

// ProcessCPUSeconds is the CPU time (user and system) process pid has used, from
// /proc/<pid>/stat.
func ProcessCPUSeconds(pid string) (float64, bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, false
	}
	f := bytes.Fields(stat[bytes.LastIndexByte(stat, ')')+1:])
	if len(f) <= 12 {
		return 0, false
	}
	utime, err1 := strconv.ParseFloat(string(f[11]), 64)
	stime, err2 := strconv.ParseFloat(string(f[12]), 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (utime + stime) / ClockTicks, true
}
