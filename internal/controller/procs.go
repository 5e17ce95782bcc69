package controller

import (
	"os"
	"runtime"
)

// berth's work is mostly waiting: on the apiserver for each request, on SSH for each host job.
// What it does between (decoding watch events, deciding, encoding writes) took 7 to 8 ms of
// CPU per task on the bench, so one Go processor has room for over a hundred tasks a second.
// Go's default gives the process one processor per core the node has, whatever its CPU
// request, and with more than the work needs the runtime spends CPU of its own: a goroutine
// made runnable while another processor idles wakes a thread, which spins for work before it
// sleeps again. On a machine whose cores are also kube-apiserver's, that CPU is taken from the
// apiserver. So berth runs on one processor unless told otherwise (Options.MaxProcs;
// docs/task-cost.md has the measurements). An operator who sets GOMAXPROCS has chosen: berth
// leaves it alone.

// setMaxProcs sets how many processors run Go code at once, unless n ≤ 0 or GOMAXPROCS is set,
// and tells whether it did.
func setMaxProcs(n int) bool {
	if n <= 0 || os.Getenv("GOMAXPROCS") != "" {
		return false
	}
	runtime.GOMAXPROCS(n)
	return true
}
