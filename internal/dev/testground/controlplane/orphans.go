package controlplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// A control plane is owned by the process that started it (a test binary, `berth dev`). When
// the owner is killed outright, its kube-apiserver, etcd and kube-controller-manager live on. Each owner therefore
// records what it started in a ledger file; the next Start reaps what dead owners left.
//
// Every checkout on the machine shares the ledger directory, each with binaries of its own: a
// ledger is reaped only by a Start from the same binaries, for only that Start can kill its
// processes, and removing the directories of processes left running breaks them without ending
// them.

var ledgerDir = filepath.Join(os.TempDir(), "berth-controlplanes")

type ledger struct {
	Owner          int      `json:"owner"`
	OwnerStartTime string   `json:"ownerStartTime"`
	BinDir         string   `json:"binDir"`
	PIDs           []int    `json:"pids"`
	Dirs           []string `json:"dirs"`
}

// recordChildren writes the ledger for the control plane this process just started: its child
// processes running binaries from binDir whose flags name one of ownDirs, and the temporary
// directories they were given. A process may run several control planes (the CaaS stand-in
// boots one per cluster); each ledger names only its own processes, so that once one has
// stopped and its pids are reused, no other ledger still points at them.
func recordChildren(binDir string, ownDirs []string) (path string, err error) {
	me := os.Getpid()
	l := ledger{Owner: me, OwnerStartTime: startTime(me), BinDir: binDir}
	for _, pid := range processesRunningFrom(binDir) {
		if parentPID(pid) != me {
			continue
		}
		if dirs := tempDirsOf(pid); slices.ContainsFunc(dirs, func(d string) bool { return slices.Contains(ownDirs, d) }) {
			l.PIDs = append(l.PIDs, pid)
			l.Dirs = append(l.Dirs, dirs...)
		}
	}
	if len(l.PIDs) == 0 {
		return "", nil
	}
	if err := os.MkdirAll(ledgerDir, 0o700); err != nil {
		return "", err
	}
	data, err := json.Marshal(l)
	if err != nil {
		return "", err
	}
	path = filepath.Join(ledgerDir, fmt.Sprintf("%d-%d.json", me, l.PIDs[0]))
	return path, os.WriteFile(path, data, 0o600)
}

// processDirPrefix names the temporary directories of ProcessDir.
const processDirPrefix = "berth-procs-"

// ProcessDir makes a temporary directory for programs that another package of the test ground
// starts beside a control plane from the binaries of BinaryDir (realtekton's Tekton, scheduler
// and kwok). Name it in each program's flags (its kubeconfig's path does): by it,
// RecordProcesses tells them from other programs, and ReapOrphans removes it with them.
func ProcessDir(name string) (string, error) {
	return os.MkdirTemp("", processDirPrefix+name+"-")
}

// RecordProcesses records in a ledger, as Start does for its own, this process's children that
// run binaries from binDir and name dir (see ProcessDir) in their flags: if this process dies
// before it stops them, the next Start from binDir kills them and removes dir. Call it once they
// have all started, and ForgetProcesses once they have stopped.
func RecordProcesses(binDir, dir string) (ledger string, err error) {
	return recordChildren(binDir, []string{dir})
}

// ForgetProcesses removes a ledger RecordProcesses wrote ("" if it found no process).
func ForgetProcesses(ledger string) error {
	if ledger == "" {
		return nil
	}
	return os.Remove(ledger)
}

// ReapOrphans kills the control-plane processes running from binDir whose owners have died and
// removes their temporary directories. It returns how many processes it killed.
func ReapOrphans(binDir string) (reaped int) {
	files, _ := filepath.Glob(filepath.Join(ledgerDir, "*.json"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var l ledger
		if json.Unmarshal(data, &l) != nil {
			_ = os.Remove(f)
			continue
		}
		if l.BinDir != binDir {
			continue // another checkout's
		}
		if startTime(l.Owner) == l.OwnerStartTime && l.OwnerStartTime != "" {
			continue // owner alive: its control plane is in use
		}
		for _, pid := range l.PIDs {
			// The pid may have been reused since; kill it only if it still runs our binary.
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Dir(exe) == binDir {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					reaped++
				}
			}
		}
		for _, d := range l.Dirs {
			_ = os.RemoveAll(d)
		}
		_ = os.Remove(f)
	}
	return reaped
}

func processesRunningFrom(binDir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && filepath.Dir(exe) == binDir {
			pids = append(pids, pid)
		}
	}
	return pids
}

// statFields returns the fields of /proc/<pid>/stat after the command name.
func statFields(pid int) []string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
}

func parentPID(pid int) int {
	f := statFields(pid)
	if len(f) < 2 {
		return -1
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// startTime tells a process from a later one that reused its pid ("" if it is gone).
func startTime(pid int) string {
	f := statFields(pid)
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// tempDirsOf returns the temporary directories named in a process's flags: envtest's, the one of
// kube-controller-manager's kubeconfig and log, and those of ProcessDir.
func tempDirsOf(pid int) []string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil
	}
	var dirs []string
	for _, arg := range strings.Split(string(data), "\x00") {
		_, value, ok := strings.Cut(arg, "=")
		if !ok {
			continue
		}
		for p := value; p != "/" && p != "."; p = filepath.Dir(p) {
			base := filepath.Base(p)
			ours := strings.HasPrefix(base, "k8s_test_framework_") || strings.HasPrefix(base, controllerManagerDirPrefix) || strings.HasPrefix(base, processDirPrefix)
			if ours && filepath.Dir(p) == os.TempDir() {
				dirs = append(dirs, p)
				break
			}
		}
	}
	return dirs
}
