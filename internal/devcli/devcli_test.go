package devcli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/cloud"
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
