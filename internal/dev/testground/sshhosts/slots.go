//go:build linux

package sshhosts

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// A slot is one host's share of the machine: netns berth-host-N, veth berthN, 198.18.N.0/24.
// Test processes running side by side (go test ./...) coordinate through one lock file per
// slot in stateDir. The owner holds an flock on it for as long as the slot is in use, so the
// kernel itself says whether the owner is alive: a killed test process drops its locks, and a
// slot whose lock can be taken has no live owner, whatever its file says. This is immune to
// PID reuse, which recording a PID alone is not.
const (
	stateDir    = "/run/berth-testhosts"
	netnsPrefix = "berth-host-"
	vethPrefix  = "berth"
	maxSlot     = 250
	netnsDir    = "/run/netns" // where `ip netns` keeps its named namespaces
)

func netnsName(slot int) string { return fmt.Sprintf("%s%d", netnsPrefix, slot) }
func vethName(slot int) string  { return fmt.Sprintf("%s%d", vethPrefix, slot) }
func lockPath(slot int) string  { return filepath.Join(stateDir, fmt.Sprintf("slot-%d.lock", slot)) }

// slotLock is a held claim on one slot.
type slotLock struct {
	slot int
	file *os.File
}

// tryLockSlot claims a slot without waiting. It returns nil, nil when a live process owns it.
func tryLockSlot(slot int) (*slotLock, error) {
	path := lockPath(slot)
	// Cleanup unlinks a lock file while holding its lock. Whoever opened the old file just
	// before then ends up holding a lock on a file nobody else can see, so check that the
	// locked file is still the one at path, and start over if it is not.
	for range 10 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("slot %d: open lock: %w", slot, err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, nil
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("slot %d: lock: %w", slot, err)
		}
		var held, named syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("slot %d: stat lock: %w", slot, err)
		}
		if err := syscall.Stat(path, &named); err == nil && held.Dev == named.Dev && held.Ino == named.Ino {
			return &slotLock{slot: slot, file: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("slot %d: lock file keeps being replaced", slot)
}

// slotRecord is what the owner writes into its lock file: who it is, for people debugging a
// stuck machine, and which temp dir to remove once the owner is gone.
type slotRecord struct {
	pid int
	dir string
}

func (l *slotLock) write(rec slotRecord) error {
	content := fmt.Sprintf("pid=%d\nnetns=%s\ndir=%s\n", rec.pid, netnsName(l.slot), rec.dir)
	if err := l.file.Truncate(0); err != nil {
		return fmt.Errorf("slot %d: write lock: %w", l.slot, err)
	}
	if _, err := l.file.WriteAt([]byte(content), 0); err != nil {
		return fmt.Errorf("slot %d: write lock: %w", l.slot, err)
	}
	return nil
}

func (l *slotLock) read() slotRecord {
	var rec slotRecord
	data, err := os.ReadFile(lockPath(l.slot))
	if err != nil {
		return rec
	}
	for line := range strings.Lines(string(data)) {
		key, value, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch key {
		case "pid":
			rec.pid, _ = strconv.Atoi(value)
		case "dir":
			rec.dir = value
		}
	}
	return rec
}

// release gives the slot up. The lock file goes too, so an idle machine keeps no state.
func (l *slotLock) release() error {
	err := os.Remove(lockPath(l.slot))
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, l.file.Close())
}

// claimSlots takes the n lowest free slots, clearing whatever a dead owner left in them.
func claimSlots(n int) ([]*slotLock, error) {
	var claimed []*slotLock
	giveBack := func() {
		for _, l := range claimed {
			l.release()
		}
	}
	for slot := 1; slot <= maxSlot && len(claimed) < n; slot++ {
		l, err := tryLockSlot(slot)
		if err != nil {
			giveBack()
			return nil, err
		}
		if l == nil {
			continue
		}
		if err := clearSlot(l.slot, l.read()); err != nil {
			l.release()
			giveBack()
			return nil, err
		}
		if err := l.write(slotRecord{pid: os.Getpid()}); err != nil {
			l.release()
			giveBack()
			return nil, err
		}
		claimed = append(claimed, l)
	}
	if len(claimed) < n {
		giveBack()
		return nil, fmt.Errorf("only %d of the %d requested host slots are free (of %d); other test processes hold the rest: see %s",
			len(claimed), n, maxSlot, stateDir)
	}
	return claimed, nil
}

var slotNumber = regexp.MustCompile(`^[1-9][0-9]*$`)

// removeLeftovers clears every slot that shows traces on this machine (a lock file, a netns,
// a veth) and has no live owner: what a test process killed mid-run (SIGKILL, a timeout, a
// crashed machine) left behind. Slots of live processes are not touched.
func removeLeftovers() error {
	seen := map[int]bool{}
	note := func(name, prefix, suffix string) {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			return
		}
		rest, ok = strings.CutSuffix(rest, suffix)
		if !ok || !slotNumber.MatchString(rest) {
			return
		}
		if n, err := strconv.Atoi(rest); err == nil && n <= maxSlot {
			seen[n] = true
		}
	}
	if entries, err := os.ReadDir(stateDir); err == nil {
		for _, e := range entries {
			note(e.Name(), "slot-", ".lock")
		}
	}
	if entries, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range entries {
			note(e.Name(), netnsPrefix, "")
		}
	}
	if links, err := net.Interfaces(); err == nil {
		for _, link := range links {
			note(link.Name, vethPrefix, "")
		}
	}

	var errs []error
	for slot := range seen {
		l, err := tryLockSlot(slot)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if l == nil {
			continue // a live process owns it
		}
		errs = append(errs, clearSlot(slot, l.read()), l.release())
	}
	return errors.Join(errs...)
}

// clearSlot removes everything a slot's previous owner may have left, in an order that never
// leaves a half-usable host: processes first, so nothing runs in a namespace being torn down.
// The caller holds the slot's lock.
func clearSlot(slot int, rec slotRecord) error {
	var errs []error
	name := netnsName(slot)
	if _, err := os.Stat(filepath.Join(netnsDir, name)); err == nil {
		errs = append(errs, killNetnsProcesses(name))
	}
	// Deleting our end of the veth takes the peer and the route with it at once; deleting the
	// netns alone would leave that to a kernel worker, and a quick re-claim of the slot could
	// find berthN still there.
	if _, err := net.InterfaceByName(vethName(slot)); err == nil {
		errs = append(errs, runCommand(nil, "ip", "link", "del", vethName(slot)))
	}
	if _, err := os.Stat(filepath.Join(netnsDir, name)); err == nil {
		errs = append(errs, runCommand(nil, "ip", "netns", "del", name))
	}
	if dir, ok := ownedTempDir(slot, rec.dir); ok {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("%s: remove %s: %w", name, dir, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: clear leftovers: %w", name, err)
	}
	return nil
}

// ownedTempDir guards the RemoveAll in clearSlot: a lock file is plain text in a shared place,
// so only a path that looks like one of our host dirs gets deleted.
func ownedTempDir(slot int, dir string) (string, bool) {
	if dir == "" || !filepath.IsAbs(dir) {
		return "", false
	}
	dir = filepath.Clean(dir)
	if !strings.HasPrefix(filepath.Base(dir), netnsName(slot)+"-") {
		return "", false
	}
	return dir, true
}
