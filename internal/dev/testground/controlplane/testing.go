package controlplane

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// RunTests starts one control plane for a test package, stores it in *cp, runs the tests and
// stops it. Use it from TestMain: os.Exit(controlplane.RunTests(m, &cp)). A missing binary is a
// failure with the command that fixes it, never a skip.
//
// Each setup function runs after the control plane is up with a context that ends when the
// tests have run, for things the whole package shares (a stand-in, a controller).
func RunTests(m *testing.M, cp **ControlPlane, setup ...func(context.Context) error) int {
	return RunTestsWith(m, cp, nil, setup...)
}

// RunTestsWith is RunTests with a control plane started with opts.
func RunTestsWith(m *testing.M, cp **ControlPlane, opts []Option, setup ...func(context.Context) error) int {
	started, err := Start(opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: no test control plane: %v\n", err)
		return 1
	}
	*cp = started
	ctx, cancel := context.WithCancel(context.Background())
	for _, s := range setup {
		if err := s(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: setting up the test package: %v\n", err)
			cancel()
			_ = started.Stop()
			return 1
		}
	}
	code := m.Run()
	cancel()
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the test control plane: %v\n", err)
	}
	return code
}
