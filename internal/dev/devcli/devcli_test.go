package devcli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/dev/devstack"
)

// berth-dev's controller serves what the production one does, and the test ground's VM cloud.
func TestProviders(t *testing.T) {
	if got, want := cloud.Types(), []string{"aws", "ibmp", "ibmz", "local-vm"}; !slices.Equal(got, want) {
		t.Errorf("provider types %v, want %v", got, want)
	}
}

// Steps of berth's image run the production berth: dev refuses to start without one, and says
// how to get it.
func TestDevNeedsTheProductionBerth(t *testing.T) {
	dir := t.TempDir()
	executable := filepath.Join(dir, "berth")
	notExecutable := filepath.Join(dir, "berth.txt")
	for path, mode := range map[string]os.FileMode{executable: 0o755, notExecutable: 0o644} {
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := productionBerth(executable); err != nil || got != executable {
		t.Errorf("--berth-binary %s: %q, %v", executable, got, err)
	}
	for _, bad := range []string{filepath.Join(dir, "missing"), notExecutable, dir} {
		if _, err := productionBerth(bad); err == nil || !strings.Contains(err.Error(), "run make build") {
			t.Errorf("--berth-binary %s: %v; want an error that says to run make build", bad, err)
		}
	}

	// Without the flag: the berth beside this executable, which a test binary does not have.
	cmd := NewRootCommand()
	cmd.SetArgs([]string{"dev", "--hosts", "0", "--state-dir", t.TempDir()})
	cmd.SetOut(&strings.Builder{})
	cmd.SetErr(&strings.Builder{})
	err := cmd.Execute()
	self, _ := os.Executable()
	if err == nil || !strings.Contains(err.Error(), filepath.Join(filepath.Dir(self), "berth")) || !strings.Contains(err.Error(), "run make build") {
		t.Errorf("dev without bin/berth: %v; want an error naming the berth beside it and saying to run make build", err)
	}
}

// The bench measures the production berth beside berth-dev wherever that can serve the
// scenario; berth-dev's own controller serves the local-vm platforms of the dynamic ones, and
// stands in when there is no berth beside it.
func TestBenchRunsTheProductionBerth(t *testing.T) {
	dir := t.TempDir()
	self, production := filepath.Join(dir, "berth-dev"), filepath.Join(dir, "berth")
	for _, path := range []string{self, production} {
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for scenario, want := range map[string]string{"static": production, "idle-cluster": production, "large": production,
		"dynamic": self, "dynamic-pool": self} {
		if got := ownBinary(self, scenario); got != want {
			t.Errorf("scenario %s runs %s, want %s", scenario, got, want)
		}
	}
	alone := filepath.Join(t.TempDir(), "berth-dev")
	if got := ownBinary(alone, "static"); got != alone {
		t.Errorf("with no berth beside it: %s, want berth-dev itself", got)
	}
}

// The run's error is the component that stopped, and the run's own failure when it is more
// than that stop seen from the run: neither is dropped, nor told twice.
func TestOutcome(t *testing.T) {
	etcd := &devstack.ComponentError{Component: "etcd", Err: errors.New("exited")}
	samplesFailed := errors.New("samples failed: remote-build-s390x: exit status 1")
	for _, tc := range []struct {
		name    string
		run     error
		failure *devstack.ComponentError
		want    []string // in the error, in this order
		not     string
	}{
		{"nothing failed", nil, nil, nil, ""},
		{"the run failed", samplesFailed, nil, []string{"samples failed"}, ""},
		{"a component stopped", nil, etcd, []string{"etcd: exited"}, ""},
		{"the run saw the stop", fmt.Errorf("waiting for the samples: %w", etcd), etcd, []string{"etcd: exited"}, "waiting for the samples"},
		{"the run was cancelled by the stop", fmt.Errorf("creating sample: %w", context.Canceled), etcd, []string{"etcd: exited"}, "creating sample"},
		{"both", samplesFailed, etcd, []string{"etcd: exited", "samples failed"}, ""},
		{"the same component, told while starting it",
			fmt.Errorf("%w (a hint)", &devstack.ComponentError{Component: "etcd", Err: errors.New("exited")}), etcd, []string{"etcd: exited (a hint)"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := outcome(tc.run, tc.failure)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			msg, at := err.Error(), 0
			for _, w := range tc.want {
				i := strings.Index(msg[at:], w)
				if i < 0 {
					t.Fatalf("error %q lacks %q after position %d", msg, w, at)
				}
				at += i + len(w)
			}
			if tc.not != "" && strings.Contains(msg, tc.not) {
				t.Errorf("error %q says %q", msg, tc.not)
			}
			if strings.Count(msg, "etcd: exited") > 1 {
				t.Errorf("error %q tells etcd's stop twice", msg)
			}
		})
	}
}

// The bench refuses, before it starts anything, what it cannot do: profile a controller it
// did not start, run a scenario it does not know, or run the floor where it cannot serve.
func TestBenchRefusesWhatItCannotDo(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--controller", "/bin/true", "--pprof", t.TempDir()}, "leave out --controller"},
		{[]string{"--scenario", "huge", "--log-dir", t.TempDir()}, "unknown scenario"},
		{[]string{"--scale", "0", "--log-dir", t.TempDir()}, "want more than 0"},
		{[]string{"--scenario", "dynamic", "--floor", "--log-dir", t.TempDir()}, "static hosts only"},
		{[]string{"--floor", "--chaos", "2", "--log-dir", t.TempDir()}, "run them apart"},
		{[]string{"--floor-pace", "30", "--log-dir", t.TempDir()}, "give --floor or --safe-floor too"},
		{[]string{"--scenario", "dynamic", "--safe-floor", "--log-dir", t.TempDir()}, "static hosts only"},
		{[]string{"--safe-floor", "--chaos", "2", "--log-dir", t.TempDir()}, "run them apart"},
		{[]string{"--floor", "--floor-pace", "-1", "--log-dir", t.TempDir()}, "want tasks a second"},
	} {
		cmd := NewRootCommand()
		cmd.SetArgs(append([]string{"bench"}, tc.args...))
		cmd.SetOut(&strings.Builder{})
		cmd.SetErr(&strings.Builder{})
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %v: %v; want an error saying %q", tc.args, err, tc.want)
		}
	}
}
