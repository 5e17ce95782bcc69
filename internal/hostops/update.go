package hostops

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/berth-ci/berth/internal/remote"
)

// UpdateRequest is the periodic maintenance of one static host.
type UpdateRequest struct {
	Target remote.Target
	// DiskPath is where builds write (the build users' homes); "/home" if empty.
	DiskPath string
	// MinFreeBytes below which the host is unhealthy.
	MinFreeBytes uint64
	// StaleAfter is the age after which a build user whose TaskRun is gone is removed.
	StaleAfter time.Duration
	// TaskRunExists tells whether a build user's TaskRun still exists. Users are removed only
	// when it says no; nil keeps every user.
	TaskRunExists func(ctx context.Context, namespace, name string) (bool, error)
	// MaintenanceCommand, if set, runs as the admin user; failing makes the host unhealthy.
	MaintenanceCommand string
}

// Report is the outcome of an update: whether the host may take builds, and why not.
type Report struct {
	Healthy    bool
	Reason     string
	FreeBytes  uint64
	TotalBytes uint64
	Removed    []string // stale build users removed
	// Leftovers are what the cleans of stale users could not remove. They are those users'
	// doing, not the host's: they leave Healthy as it is, and the next update tries again.
	Leftovers []*LeftoverError
	// Warning is what the operator should know of a host that still takes builds: no
	// systemd, so a build is not bounded as a whole (see UnboundedWarning).
	Warning string
}

// UnboundedWarning is a check's Warning for a host where systemd does not run: each build
// user's processes get their limits.d limits, but no slice bounds the build's memory and CPU
// as a whole, so one build can starve the host's sshd and agents.
func UnboundedWarning(address string) string {
	return fmt.Sprintf("systemd does not run on host %s: each build's processes get their limits (nproc, CPU time, open files), "+
		"but no build is bounded as a whole (no slice with MemoryMax, CPUQuota, CPUWeight, TasksMax), so one build can take the host's memory and CPUs", address)
}

// Update checks that the host is reachable and has disk to spare, removes stale build users,
// and runs the maintenance command. An unreachable host is a report, not an error: it is the
// health check's answer.
func Update(ctx context.Context, req UpdateRequest) Report {
	path := req.DiskPath
	if path == "" {
		path = "/home"
	}
	client, err := remote.Dial(ctx, req.Target)
	if err != nil {
		return Report{Reason: err.Error()}
	}
	defer client.Close()
	line, err := asRoot(req.Target, inspectScript, path)
	if err != nil {
		return Report{Reason: err.Error()}
	}
	out, err := client.Run(ctx, "inspecting the host", line, nil)
	if err != nil {
		return Report{Reason: err.Error()}
	}
	inv, err := parseInventory(out)
	if err != nil {
		return Report{Reason: fmt.Sprintf("host %s: %v", req.Target.Address, err)}
	}
	report := Report{Healthy: true, FreeBytes: inv.free, TotalBytes: inv.total}
	if inv.noSystemd {
		report.Warning = UnboundedWarning(req.Target.Address)
	}
	var reasons []string
	if inv.free < req.MinFreeBytes {
		reasons = append(reasons, fmt.Sprintf("only %s free on %s of host %s, less than the %s required",
			humanBytes(inv.free), path, req.Target.Address, humanBytes(req.MinFreeBytes)))
	}
	for _, u := range inv.users {
		if !userNameRE.MatchString(u.name) || u.owner == "" || req.TaskRunExists == nil || inv.now.Sub(u.since) < req.StaleAfter {
			continue
		}
		ns, name, ok := strings.Cut(u.owner, "/")
		if !ok {
			continue
		}
		exists, err := req.TaskRunExists(ctx, ns, name)
		if err != nil || exists {
			continue // when in doubt, keep: a live build must never lose its user
		}
		if err := clean(ctx, client, req.Target, u.name); err != nil {
			reasons = report.failedClean(reasons, u.name, err)
			continue
		}
		report.Removed = append(report.Removed, u.name)
	}
	// A claimed UID whose user is gone is a provision cut short or a clean that found
	// leftovers: once it is as old as a stale user, nothing is still making it, and a clean
	// retries it (it knows the user's IDs from the claim).
	for _, c := range inv.claims {
		if !userNameRE.MatchString(c.name) || req.TaskRunExists == nil || req.StaleAfter <= 0 || inv.now.Sub(c.since) < req.StaleAfter {
			continue
		}
		if err := clean(ctx, client, req.Target, c.name); err != nil {
			reasons = report.failedClean(reasons, c.name, err)
			continue
		}
		report.Removed = append(report.Removed, c.name)
	}
	if req.MaintenanceCommand != "" {
		if _, err := client.Run(ctx, "the maintenance command", req.MaintenanceCommand, nil); err != nil {
			reasons = append(reasons, err.Error())
		}
	}
	if len(reasons) > 0 {
		report.Healthy, report.Reason = false, strings.Join(reasons, "; ")
	}
	return report
}

// failedClean files a stale user's failed clean: a leftover under Leftovers, anything else as
// a reason the host is unhealthy.
func (r *Report) failedClean(reasons []string, user string, err error) []string {
	var left *LeftoverError
	if errors.As(err, &left) {
		r.Leftovers = append(r.Leftovers, left)
		return reasons
	}
	return append(reasons, fmt.Sprintf("could not remove stale user %s: %v", user, err))
}

type buildUser struct {
	name  string
	since time.Time
	owner string // namespace/name of its TaskRun, if recorded
}

type inventory struct {
	free, total uint64
	users       []buildUser
	claims      []buildUser // claimed UIDs whose user is gone, by the name the claim records
	now         time.Time   // the host's clock, against which ages are measured
	noSystemd   bool        // the host said systemd does not run there
}

func parseInventory(out []byte) (inventory, error) {
	var inv inventory
	sawDisk := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "disk":
			if len(f) != 3 {
				return inv, fmt.Errorf("unreadable disk report %q", sc.Text())
			}
			totalKiB, err1 := strconv.ParseUint(f[1], 10, 64)
			freeKiB, err2 := strconv.ParseUint(f[2], 10, 64)
			if err1 != nil || err2 != nil {
				return inv, fmt.Errorf("unreadable disk report %q", sc.Text())
			}
			inv.total, inv.free, sawDisk = totalKiB*1024, freeKiB*1024, true
		case "user":
			if len(f) < 3 {
				continue
			}
			secs, _ := strconv.ParseInt(f[2], 10, 64)
			u := buildUser{name: f[1], since: time.Unix(secs, 0)}
			if len(f) > 3 {
				u.owner = f[3]
			}
			inv.users = append(inv.users, u)
		case "claim":
			if len(f) != 4 {
				continue
			}
			secs, _ := strconv.ParseInt(f[3], 10, 64)
			inv.claims = append(inv.claims, buildUser{name: f[2], since: time.Unix(secs, 0)})
		case "systemd":
			inv.noSystemd = len(f) == 2 && f[1] == "no"
		case "now":
			if len(f) == 2 {
				secs, _ := strconv.ParseInt(f[1], 10, 64)
				inv.now = time.Unix(secs, 0)
			}
		}
	}
	if !sawDisk {
		return inv, fmt.Errorf("the host reported no disk usage (df failed?)")
	}
	return inv, nil
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
