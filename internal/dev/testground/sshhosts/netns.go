//go:build linux

package sshhosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Addresses come from 198.18.0.0/15 (RFC 2544, set aside for benchmarking networks), which no
// real network this machine talks to uses, so a test host can never shadow a real one.
func hostIP(slot int) string   { return fmt.Sprintf("198.18.%d.2", slot) }
func routerIP(slot int) string { return fmt.Sprintf("198.18.%d.1", slot) }

// runCommand runs a setup command; a nil ctx means it is not bounded by the caller (cleanup,
// which must run even when the caller's context is gone).
func runCommand(ctx context.Context, name string, args ...string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// createNetwork gives a slot its namespace and a point-to-point /24 with this machine:
// berthN (198.18.N.1) here, eth0 (198.18.N.2) in the namespace. The namespace has no default
// route, so a host reaches nothing but this machine.
func createNetwork(ctx context.Context, slot int) error {
	ns, veth := netnsName(slot), vethName(slot)
	steps := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "addr", "add", routerIP(slot) + "/24", "dev", veth},
		{"ip", "link", "set", veth, "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "addr", "add", hostIP(slot) + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
	}
	for _, step := range steps {
		if err := runCommand(ctx, step[0], step[1:]...); err != nil {
			return fmt.Errorf("%s: network: %w", ns, err)
		}
	}
	// Cut relies on the route to 198.18.N.0/24 staying in use while berthN has no carrier.
	// That is the kernel default, but a machine with ignore_routes_with_linkdown=1 would send
	// a cut host's traffic to the default route instead, off this machine.
	sysctl := "/proc/sys/net/ipv4/conf/" + veth + "/ignore_routes_with_linkdown"
	if err := os.WriteFile(sysctl, []byte("0"), 0o644); err != nil {
		return fmt.Errorf("%s: network: %w", ns, err)
	}
	return nil
}

// netnsPIDs lists the processes whose network namespace is ns.
func netnsPIDs(ns string) ([]int, error) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns pids %s: %w", ns, err)
	}
	var pids []int
	for field := range strings.FieldsSeq(string(out)) {
		if pid, err := strconv.Atoi(field); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killNetnsProcesses kills everything in ns and waits until it is gone, so that no sshd or
// user process outlives its host, even one that setns'd in from outside the host's PID
// namespace.
func killNetnsProcesses(ns string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, err := netnsPIDs(ns)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: processes %v survive SIGKILL", ns, pids)
		}
		for _, pid := range pids {
			if pid == os.Getpid() {
				// A thread of this process entered the namespace and stayed: killing it would
				// kill the caller, a test binary, without a word.
				return fmt.Errorf("%s: this process (%d) has a thread in the namespace", ns, pid)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("%s: kill %d: %w", ns, pid, err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// routeDevice says which link this machine would send a packet for ip out of.
func routeDevice(ip string) (string, error) {
	out, err := exec.Command("ip", "-o", "route", "get", ip).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ip route get %s: %w: %s", ip, err, bytes.TrimSpace(out))
	}
	fields := strings.Fields(string(out))
	for i, f := range fields {
		if f == "dev" && i+1 < len(fields) {
			return fields[i+1], nil
		}
	}
	return "", fmt.Errorf("ip route get %s: no device in %q", ip, out)
}

// HoldNamespace opens the named network namespace (a host's is its Name) and returns the open
// file and the namespace's inode. While the file stays open the namespace, and with it its
// inode, outlives its name. The kernel gives a freed namespace's inode to the next one made, and
// a slot given back may at once be another host's, so a check by inode that nothing of a host
// is left after it is gone is only sound while its namespace is held.
func HoldNamespace(name string) (*os.File, uint64, error) {
	f, err := os.Open(filepath.Join(netnsDir, name))
	if err != nil {
		return nil, 0, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Ino, nil
}
