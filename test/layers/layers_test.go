// Package layers_test holds berth's packages to their layers: the domain at the bottom, then
// the adapters (Kubernetes records, SSH, clouds), the capacity the owners share, the owners (one controller per concern),
// the wiring and the commands; the dev wing (test ground, dev stack, bench, dev CLI) above all
// of the product. A package imports only from layers below its own, so the product never
// links the dev wing and a lower floor never learns of a higher one. docs/architecture.md
// draws the same table.
package layers_test

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/berth-ci/berth/"

// unit is one package or one tree of packages (a path ending in "/..."), relative to the module.
type unit = string

// layer is a floor of the import graph. Units of a layer may import each other, unless the
// layer says alone: then each unit stands on the layers below only (the owners: a controller
// of one concern never calls into another's).
type layer struct {
	name  string
	alone bool
	units []unit
}

// layers, lowest first. Every package of the module must be in exactly one unit.
var layers = []layer{
	{name: "domain", units: []unit{
		"internal/allocation/...", "internal/config/...", "internal/contract/...", "internal/cloud",
		"internal/fleet/...", "internal/localaffinity/...", "internal/otp", "internal/remote/...",
		"internal/warning/...", "internal/cluster/...", "internal/tasksecret/...", "internal/retryable/...",
	}},
	{name: "adapters", units: []unit{
		"api/...", "internal/kubescheme/...", "internal/cloud/awsec2/...", "internal/cloud/ibmp/...",
		"internal/cloud/ibmz/...", "internal/cloud/ibmiam/...", "internal/hostops/...",
		"internal/hostkeys/...", "internal/provision/...", "internal/incident/...",
		"internal/taskgen/...", "internal/status/...", "internal/otp/keyserver/...",
		"internal/hostconfig/...", "internal/adminkeys/...", "internal/version/...",
		"internal/konfluxmetrics/...",
	}},
	// What the owners share: the ledger and its wake-ups.
	{name: "capacity", units: []unit{"internal/controller/capacity/..."}},
	{name: "owners", alone: true, units: []unit{
		"internal/controller/taskrun/...", "internal/controller/hosts/...", "internal/webhook/...",
	}},
	{name: "wiring", units: []unit{"internal/controller"}},
	{name: "commands", units: []unit{"internal/cli/...", "cmd/berth/..."}},
	// The dev wing.
	{name: "dev ground", units: []unit{
		"internal/dev/testground/caasstandin/...", "internal/dev/testground/controlplane/...",
		"internal/dev/testground/dashboards/...", "internal/dev/testground/ec2fake/...", "internal/dev/testground/iamfake/...",
		"internal/dev/testground/managerrun/...", "internal/dev/testground/missing/...", "internal/dev/testground/powerfake/...",
		"internal/dev/testground/rbac/...", "internal/dev/testground/realdata/...", "internal/dev/testground/realprometheus/...", "internal/dev/testground/realtekton/...",
		"internal/dev/testground/repo/...", "internal/dev/testground/spacestandin/...",
		"internal/dev/testground/sshfake/...", "internal/dev/testground/sshhosts/...",
		"internal/dev/testground/tektonstandin/...", "internal/dev/testground/tlscerts/...",
		"internal/dev/testground/vmcloud/...", "internal/dev/testground/vpcfake/...",
		"internal/dev/localvm/...", "internal/cloud/cloudfake/...", "internal/provision/provisionfake/...",
	}},
	{name: "dev stack", units: []unit{"internal/dev/devstack/..."}},
	{name: "dev harness", units: []unit{"internal/dev/testground/stacktest/...", "internal/dev/bench/..."}},
	{name: "dev commands", units: []unit{"internal/dev/devcli/...", "cmd/berth-dev/...", "hack/release/..."}},
	{name: "tests", units: []unit{"test/..."}},
}

// place finds the layer and unit of a package: the longest unit that holds it.
func place(pkg string) (layerIdx int, u unit, ok bool) {
	best := -1
	for i, l := range layers {
		for _, cand := range l.units {
			tree, isTree := strings.CutSuffix(cand, "/...")
			holds := pkg == cand || isTree && (pkg == tree || strings.HasPrefix(pkg, tree+"/"))
			if holds && len(cand) > best {
				best, layerIdx, u, ok = len(cand), i, cand, true
			}
		}
	}
	return layerIdx, u, ok
}

// violations lists each import of graph (package → its non-test imports, module-relative;
// imports outside the module are ignored) that runs sideways between lone units or up.
func violations(graph map[string][]string) []string {
	var bad []string
	for pkg, imports := range graph {
		li, lu, ok := place(pkg)
		if !ok {
			bad = append(bad, fmt.Sprintf("%s is in no layer: add it to the table", pkg))
			continue
		}
		for _, imp := range imports {
			if _, inModule := graph[imp]; !inModule {
				continue
			}
			ii, iu, ok := place(imp)
			switch {
			case !ok:
				continue // reported as a package of its own
			case ii > li:
				bad = append(bad, fmt.Sprintf("%s (%s) imports %s (%s): up a layer", pkg, layers[li].name, imp, layers[ii].name))
			case ii == li && layers[li].alone && iu != lu:
				bad = append(bad, fmt.Sprintf("%s imports %s: two %s depend on each other", pkg, imp, layers[li].name))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

// importGraph reads the non-test imports of every package of the module.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/berth-ci/berth/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], module)
		if !ok {
			continue
		}
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	return graph
}

func TestEveryImportRunsDown(t *testing.T) {
	graph := importGraph(t)
	if len(graph) < 50 {
		t.Fatalf("go list found %d packages of the module: it did not read the module", len(graph))
	}
	for _, v := range violations(graph) {
		t.Error(v)
	}
}

// The check itself: each kind of wrong import must be caught.
func TestAWrongImportIsRejected(t *testing.T) {
	cases := map[string]struct {
		graph map[string][]string
		want  string
	}{
		"the domain imports an owner": {
			graph: map[string][]string{"internal/allocation": {"internal/controller/taskrun"}, "internal/controller/taskrun": nil},
			want:  "internal/allocation (domain) imports internal/controller/taskrun (owners): up a layer",
		},
		"the product imports the dev wing": {
			graph: map[string][]string{"internal/controller/taskrun": {"internal/dev/testground/sshhosts"}, "internal/dev/testground/sshhosts": nil},
			want:  "internal/controller/taskrun (owners) imports internal/dev/testground/sshhosts (dev ground): up a layer",
		},
		"one owner imports another": {
			graph: map[string][]string{"internal/controller/taskrun": {"internal/controller/hosts"}, "internal/controller/hosts": nil},
			want:  "internal/controller/taskrun imports internal/controller/hosts: two owners depend on each other",
		},
		"a package nobody placed": {
			graph: map[string][]string{"internal/util": nil},
			want:  "internal/util is in no layer: add it to the table",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := violations(tc.graph); !slices.Equal(got, []string{tc.want}) {
				t.Errorf("violations = %q, want %q", got, tc.want)
			}
		})
	}
	// Within one owner's tree and down the layers, nothing is wrong.
	fine := map[string][]string{
		"internal/controller/taskrun/phases": {"internal/allocation"},
		"internal/controller/taskrun":        {"internal/controller/taskrun/phases", "internal/hostops"},
		"internal/allocation":                nil, "internal/hostops": nil,
	}
	if got := violations(fine); len(got) != 0 {
		t.Errorf("a graph that runs down is rejected: %q", got)
	}
}
