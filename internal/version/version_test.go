package version

import (
	"runtime"
	"runtime/debug"
	"testing"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

const rev = "2fc450897cec49b8c5f550e1d6f2f1c1d42a6fe3"

func vcs(revision, modified string) *debug.BuildInfo {
	b := &debug.BuildInfo{Main: debug.Module{Path: "github.com/berth-ci/berth", Version: "v0.0.0-20261128220034-2fc450897cec+dirty"}}
	b.Settings = append(b.Settings, debug.BuildSetting{Key: "vcs", Value: "git"}, debug.BuildSetting{Key: "vcs.revision", Value: revision})
	if modified != "" {
		b.Settings = append(b.Settings, debug.BuildSetting{Key: "vcs.modified", Value: modified})
	}
	return b
}

// What each way of building berth reports.
func TestFromBuild(t *testing.T) {
	for _, tc := range []struct {
		name               string
		stampedV, stampedC string
		build              *debug.BuildInfo
		wantV, wantC       string
	}{
		{"make build, tagged", "v0.1.0", rev, vcs(rev, "false"), "v0.1.0", rev},
		{"make build, untagged with changes", "2fc4508-dirty", rev, nil, "2fc4508-dirty", rev},
		{"go build, clean checkout", "", "", vcs(rev, "false"), "2fc4508", rev},
		{"go build, uncommitted changes", "", "", vcs(rev, "true"), "2fc4508-dirty", rev},
		{"go install of a tagged version", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}}, "v0.2.0", Unknown},
		{"go run or go test", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Devel, Unknown},
		{"no build information", "", "", nil, Devel, Unknown},
		{"only the version stamped", "v0.1.0", "", vcs(rev, "true"), "v0.1.0", rev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fromBuild(tc.stampedV, tc.stampedC, tc.build)
			if got.Version != tc.wantV || got.Commit != tc.wantC {
				t.Errorf("version %q commit %q, want %q %q", got.Version, got.Commit, tc.wantV, tc.wantC)
			}
			if got.GoVersion != runtime.Version() || got.Platform != runtime.GOOS+"/"+runtime.GOARCH {
				t.Errorf("go %q platform %q, want %q %s/%s", got.GoVersion, got.Platform, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			}
		})
	}
}

// The process's metrics say which build it is: berth_build_info, 1, labelled with Get().
func TestBuildInfoMetric(t *testing.T) {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := Get()
	for _, f := range families {
		if f.GetName() != "berth_build_info" {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("berth_build_info has %d series, want 1", len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != want.Version || labels["commit"] != want.Commit || labels["goversion"] != want.GoVersion || len(labels) != 3 {
			t.Errorf("berth_build_info labels %v, want version %q commit %q goversion %q", labels, want.Version, want.Commit, want.GoVersion)
		}
		if v := m.GetGauge().GetValue(); v != 1 {
			t.Errorf("berth_build_info is %v, want 1", v)
		}
		return
	}
	t.Fatal("controller-runtime's registry has no berth_build_info")
}
