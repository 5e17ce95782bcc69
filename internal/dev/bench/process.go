package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// controllerProcess is the controller under test. Chaos kills it and starts it again; what
// the killed processes used is kept, so usage covers the whole run.
type controllerProcess struct {
	command, kubeconfig, logPath string
	// startedAt is when the first process started.
	startedAt time.Time

	mu  sync.Mutex
	cmd *exec.Cmd
	// exited is closed once cmd has been waited for.
	exited chan struct{}
	log    *os.File
	// spent is what the killed processes used.
	spent usage
	// resident is the highest resident set sampled of any of its processes, split by kind.
	resident residentSet
	kills    int
}

type usage struct {
	peakRSSMiB, cpuSeconds float64
	// peakAnonMiB and peakFileMiB split the highest resident set sampled (residentSet).
	peakAnonMiB, peakFileMiB float64
}

// startController runs the command line through sh (exec, so the pid is the controller's) with
// KUBECONFIG and POD_NAMESPACE set.
func startController(command, kubeconfig, logPath string) (*controllerProcess, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	// Measured from a cold binary, as a pod starts; a restart after a kill finds its pages
	// cached, as a restarted container on the same node would.
	if err := evictExecutable(command); err != nil {
		fmt.Fprintf(logFile, "bench: the controller's binary may start warm (its peak RSS then counts more of its pages): %v\n", err)
	}
	p := &controllerProcess{command: command, kubeconfig: kubeconfig, logPath: logPath, log: logFile, startedAt: time.Now()}
	if err := p.start(); err != nil {
		logFile.Close()
		return nil, err
	}
	return p, nil
}

// start runs a new process of the command; the caller holds mu (or owns p alone).
func (p *controllerProcess) start() error {
	cmd := exec.Command("sh", "-c", "exec "+p.command)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+p.kubeconfig, "POD_NAMESPACE="+controllerNamespace)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that started the child ends, not the process. Go
		// ends a thread when a goroutine locked to it returns, as the VM cloud's host
		// starters do: had one of them run on the thread that started the controller, the
		// controller would die with it. This goroutine holds its thread until the
		// controller is gone.
		runtime.LockOSThread()
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting the controller %q: %w", p.command, err)
	}
	p.cmd, p.exited = cmd, exited
	go p.sampleResident(cmd.Process.Pid, exited)
	return nil
}

// residentSet is a process's resident memory at one moment, from /proc/<pid>/status, in KiB:
// all of it (VmRSS), its anonymous pages (RssAnon: the heap, stacks and the runtime's own) and
// its file-backed pages (RssFile: those of its binary and libraries that it touched).
type residentSet struct{ total, anon, file float64 }

// residentSampleInterval is how often sampleResident reads a process's resident set.
const residentSampleInterval = 50 * time.Millisecond

// sampleResident keeps in p.resident the highest resident set of process pid it sees until
// exited is closed. The kernel keeps the peak itself (VmHWM) but not what it was made of; a
// sample every residentSampleInterval comes within a few pages of it, since the controller's
// resident set grows with its heap and the code it has run.
func (p *controllerProcess) sampleResident(pid int, exited <-chan struct{}) {
	path := "/proc/" + strconv.Itoa(pid) + "/status"
	tick := time.NewTicker(residentSampleInterval)
	defer tick.Stop()
	for {
		if status, err := os.ReadFile(path); err == nil {
			if rs, ok := parseResident(status); ok {
				p.mu.Lock()
				if rs.total > p.resident.total {
					p.resident = rs
				}
				p.mu.Unlock()
			}
		}
		select {
		case <-exited:
			return
		case <-tick.C:
		}
	}
}

// parseResident reads a residentSet from the text of /proc/<pid>/status; false when it lacks
// any of the three (a process that has exited, or a kernel older than 4.5).
func parseResident(status []byte) (residentSet, bool) {
	kib, ok := statusKiB(status, "VmRSS:", "RssAnon:", "RssFile:")
	if !ok {
		return residentSet{}, false
	}
	return residentSet{total: kib[0], anon: kib[1], file: kib[2]}, true
}

// statusKiB reads the values of keys (each with its colon, "VmHWM:") from the text of
// /proc/<pid>/status, in KiB, in the order asked; false unless each is there as a number.
func statusKiB(status []byte, keys ...string) ([]float64, bool) {
	values, found := make([]float64, len(keys)), 0
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if k := slices.Index(keys, f[0]); k >= 0 {
			kib, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return nil, false
			}
			values[k] = kib
			found++
		}
	}
	return values, found == len(keys)
}

// killAndRestart kills the controller with SIGKILL, as a node failure or the OOM killer
// would, and starts it again at once with the same command.
func (p *controllerProcess) killAndRestart() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.spent = p.spent.plus(exited(p.cmd.ProcessState))
	p.kills++
	fmt.Fprintf(p.log, "\n--- bench: controller killed (SIGKILL) at %s, kill %d; starting it again ---\n\n",
		time.Now().Format(time.RFC3339Nano), p.kills)
	return p.start()
}

// died says how the controller ended when it ended on its own (not by chaos, not stopped).
func (p *controllerProcess) died() (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.String(), true
	default:
		return "", false
	}
}

// killCount is how many times the controller was killed.
func (p *controllerProcess) killCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kills
}

// exited is what a process that ended used, from its rusage.
func exited(s *os.ProcessState) usage {
	if s == nil {
		return usage{}
	}
	u := usage{cpuSeconds: (s.UserTime() + s.SystemTime()).Seconds()}
	if ru, ok := s.SysUsage().(*syscall.Rusage); ok {
		u.peakRSSMiB = float64(ru.Maxrss) / 1024 // KiB on Linux
	}
	return u
}

// plus adds up CPU time and keeps the higher peak.
func (u usage) plus(v usage) usage {
	return usage{peakRSSMiB: max(u.peakRSSMiB, v.peakRSSMiB), cpuSeconds: u.cpuSeconds + v.cpuSeconds}
}

// usage is the peak resident memory and CPU time of the running controller (from /proc) and
// of the ones killed before it.
func (p *controllerProcess) usage() usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	var u usage
	pid := strconv.Itoa(p.cmd.Process.Pid)
	if status, err := os.ReadFile("/proc/" + pid + "/status"); err == nil {
		if kib, ok := statusKiB(status, "VmHWM:"); ok {
			u.peakRSSMiB = kib[0] / 1024
		}
	}
	u.cpuSeconds, _ = controlplane.ProcessCPUSeconds(pid)
	u = u.plus(p.spent)
	u.peakAnonMiB, u.peakFileMiB = p.resident.anon/1024, p.resident.file/1024
	// exec starts the kernel's high-water mark afresh, and the sampler may have seen the
	// forked child before it: the peak is at least the highest resident set sampled, so that
	// the split never adds up to more than the peak it splits.
	u.peakRSSMiB = max(u.peakRSSMiB, p.resident.total/1024)
	return u
}

func (p *controllerProcess) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.log.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// BerthController is the command line that runs berth's controller from binary (berth or
// berth-dev) the way the bench measures it: no metrics, probes or host checks, and no
// admission webhook, since no scenario has a local platform and the bench's control plane
// calls no webhook. provisioner is ssh or taskrun.
func BerthController(binary, provisioner string) string {
	return binary + " controller --metrics-bind-address=0 --health-probe-bind-address=0 --webhook-port=0 --host-check-interval=0 --provisioner=" + provisioner
}
