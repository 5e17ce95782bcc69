package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/cloud"
)

// The production binary links none of the test ground, the dev stack, the bench (nor its
// plotting library) or the test-only cloud provider and provisioner: they are berth-dev's (cmd/berth-dev).
func TestLinksNoDevelopmentCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"github.com/berth-ci/berth/internal/dev",
		"github.com/berth-ci/berth/internal/cloud/cloudfake",
		"github.com/berth-ci/berth/internal/provision/provisionfake",
		"gonum.org/v1/plot",
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if pkg == f || strings.HasPrefix(pkg, f+"/") {
				t.Errorf("cmd/berth links %s", pkg)
			}
		}
	}
}

// The production berth launches VMs on the real clouds only.
func TestProviders(t *testing.T) {
	if got, want := cloud.Types(), []string{"aws", "ibmp", "ibmz"}; !slices.Equal(got, want) {
		t.Errorf("provider types %v, want %v", got, want)
	}
}
