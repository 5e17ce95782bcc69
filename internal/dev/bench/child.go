package bench

import "context"

// Child is a berth controller run as a child process the way the bench runs it (see
// startController), for tests that measure what the real binary uses rather than a controller
// inside the test's own process.
type Child struct{ p *controllerProcess }

// StartChild runs command (a shell command line, exec'd so the pid is the controller's) with
// KUBECONFIG=kubeconfig and its output appended to logPath.
func StartChild(command, kubeconfig, logPath string) (*Child, error) {
	p, err := startController(command, kubeconfig, logPath)
	if err != nil {
		return nil, err
	}
	return &Child{p: p}, nil
}

// PeakRSSMiB is the highest VmHWM of the running process and of those Restart killed.
func (c *Child) PeakRSSMiB() float64 { return c.p.usage().peakRSSMiB }

// Restart kills the process with SIGKILL, as the OOM killer would, and starts it again.
func (c *Child) Restart() error { return c.p.killAndRestart() }

// Died says how the process ended when it ended on its own.
func (c *Child) Died() (string, bool) { return c.p.died() }

// Stop ends the process with SIGTERM (SIGKILL after 15 seconds).
func (c *Child) Stop() { c.p.stop() }

// GoroutineStacks is the stack of each goroutine of the controller serving net/http/pprof at
// address, now (goroutine?debug=2).
func GoroutineStacks(ctx context.Context, address string) (string, error) {
	data, err := (&Pprof{Address: address}).fetch(ctx, "/debug/pprof/goroutine?debug=2")
	return string(data), err
}

// HeapProfile is the heap profile (gzipped protobuf, after a GC) of the controller serving
// net/http/pprof at address.
func HeapProfile(ctx context.Context, address string) ([]byte, error) {
	return (&Pprof{Address: address}).fetch(ctx, "/debug/pprof/heap?gc=1")
}
