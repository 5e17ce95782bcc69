package bench

import (
	"bytes"
	"os"
	"strconv"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// On a virtual machine the host may run other guests on the cores under this one's processors.
// The time a processor of this machine was ready to run but the host ran something else is the
// kernel's steal time (/proc/stat). A run with much of it was slowed by its neighbours, not by
// what it ran, so a pair in which one run had much more of it than the other compares the
// neighbours, not the controllers. Result.StealSeconds shows it beside each run.

// stealSeconds is the steal time of all the machine's processors together so far; false where
// /proc/stat cannot tell (not Linux, or a kernel without the field).
func stealSeconds() (float64, bool) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	return parseSteal(stat)
}

// parseSteal reads the steal time from the first line of /proc/stat, the machine's total:
// "cpu" then user, nice, system, idle, iowait, irq, softirq and steal (the eighth, there since
// Linux 2.6.11, proc(5)), in USER_HZ.
func parseSteal(stat []byte) (float64, bool) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, false
	}
	ticks, err := strconv.ParseUint(string(f[8]), 10, 64)
	if err != nil {
		return 0, false
	}
	return float64(ticks) / controlplane.ClockTicks, true
}
