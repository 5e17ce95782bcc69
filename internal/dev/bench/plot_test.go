package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The plot is an SVG with both panels and a line per run, named by its label.
func TestWritePlot(t *testing.T) {
	run := func(spread time.Duration) *Result {
		tl := Timeline{Start: at(0)}
		for i := range 50 {
			created := at(0).Add(time.Duration(i) * 10 * time.Millisecond)
			secret := created.Add(time.Duration(i) * spread)
			tl.Tasks = append(tl.Tasks, TaskTimes{Created: created, Secret: secret, Done: secret.Add(time.Second)})
		}
		tl.Tasks = append(tl.Tasks, TaskTimes{Created: at(1)}) // never served: not drawn
		return &Result{Timeline: tl}
	}
	baseline, berth := run(time.Second), run(20*time.Millisecond)
	path := filepath.Join(t.TempDir(), "bench.svg")
	names := map[*Result]string{baseline: "baseline, scale 1", berth: "controller, scale 1"}
	if err := WritePlot(path, []*Result{baseline, berth}, func(r *Result) string { return names[r] }); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(data)
	for _, want := range []string{"<svg", "creation → secret latency", "tasks served over time", "baseline, scale 1", "controller, scale 1"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the plot lacks %q", want)
		}
	}
	png := filepath.Join(t.TempDir(), "bench.png")
	if err := WritePlot(png, []*Result{baseline, berth}, func(r *Result) string { return names[r] }); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(png); err != nil || !strings.HasPrefix(string(data), "\x89PNG") {
		t.Errorf("%s is no PNG: %v", png, err)
	}
	if err := WritePlot(path, []*Result{{}}, func(*Result) string { return "" }); err == nil {
		t.Error("a plot of runs that served nothing must be refused")
	}
	if err := WritePlot(filepath.Join(t.TempDir(), "bench.gif"), []*Result{berth}, func(*Result) string { return "" }); err == nil {
		t.Error("a format other than SVG and PNG must be refused")
	}
}
