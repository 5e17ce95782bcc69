package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
)

// PrintTable writes results side by side, and with two results, their ratio (second/first).
func PrintTable(w io.Writer, results []*Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "metric\t"
	for i := range results {
		header += fmt.Sprintf("run %d\t", i+1)
	}
	if len(results) == 2 {
		header += "run 2 / run 1\t"
	}
	fmt.Fprintln(tw, header)
	row := func(name string, value func(*Result) float64, format string) {
		line := name + "\t"
		for _, r := range results {
			line += fmt.Sprintf(format+"\t", value(r))
		}
		if len(results) == 2 {
			if a := value(results[0]); a != 0 {
				line += fmt.Sprintf("%.2fx\t", value(results[1])/a)
			} else {
				line += "-\t"
			}
		}
		fmt.Fprintln(tw, line)
	}
	row("tasks served", func(r *Result) float64 { return float64(r.Served) }, "%.0f")
	row("creation→secret p50 ms", func(r *Result) float64 { return r.SecretLatency.P50 }, "%.1f")
	row("creation→secret p90 ms", func(r *Result) float64 { return r.SecretLatency.P90 }, "%.1f")
	row("creation→secret p99 ms", func(r *Result) float64 { return r.SecretLatency.P99 }, "%.1f")
	row("creation→secret max ms", func(r *Result) float64 { return r.SecretLatency.Max }, "%.1f")
	row("slot freed→next allocation p50 ms", func(r *Result) float64 { return r.HandOver.P50 }, "%.1f")
	row("slot freed→next allocation p99 ms", func(r *Result) float64 { return r.HandOver.P99 }, "%.1f")
	row("makespan s", func(r *Result) float64 { return r.MakespanSeconds }, "%.1f")
	row("allocations per second", func(r *Result) float64 { return r.AllocationsPerSec }, "%.1f")
	row("API writes per allocation", func(r *Result) float64 { return r.WritesPerAllocation }, "%.1f")
	row("controller peak RSS MiB", func(r *Result) float64 { return r.PeakRSSMiB }, "%.1f")
	row("controller CPU s", func(r *Result) float64 { return r.CPUSeconds }, "%.1f")
	row("over-commit violations", func(r *Result) float64 { return float64(r.Violations) }, "%.0f")
	row("controller kills", func(r *Result) float64 { return float64(r.ControllerKills) }, "%.0f")
	row("warnings on user tasks", func(r *Result) float64 {
		n := 0
		for _, c := range r.UserWarnings {
			n += c
		}
		return float64(n)
	}, "%.0f")
	if slices.ContainsFunc(results, func(r *Result) bool { return r.VMResult != nil }) {
		vm := func(f func(*VMResult) float64) func(*Result) float64 {
			return func(r *Result) float64 {
				if r.VMResult == nil {
					return 0
				}
				return f(r.VMResult)
			}
		}
		row("VMs launched", vm(func(v *VMResult) float64 { return float64(v.InstancesLaunched) }), "%.0f")
		row("VMs up at once, peak", vm(func(v *VMResult) float64 { return float64(v.PeakInstances) }), "%.0f")
		row("launches above max-instances", vm(func(v *VMResult) float64 { return float64(v.MaxInstancesExceeded) }), "%.0f")
		row("double launches", vm(func(v *VMResult) float64 { return float64(v.DoubleLaunches) }), "%.0f")
		row("leaked VMs", vm(func(v *VMResult) float64 { return float64(v.LeakedInstances) }), "%.0f")
		row("single-use VMs reused", vm(func(v *VMResult) float64 { return float64(v.SingleUseReused) }), "%.0f")
		row("VM running→first secret p50 ms", vm(func(v *VMResult) float64 { return v.ReadyToSecret.P50 }), "%.1f")
		row("VM running→first secret p99 ms", vm(func(v *VMResult) float64 { return v.ReadyToSecret.P99 }), "%.1f")
	}
	tw.Flush()
	for i, r := range results {
		fmt.Fprintf(w, "run %d: %s, scenario %s, hosts reached by %s\n", i+1, r.Controller, r.Scenario, r.Provisioner)
		for _, reason := range slices.Sorted(maps.Keys(r.UserWarnings)) {
			fmt.Fprintf(w, "run %d: %d Warning events %s on user tasks\n", i+1, r.UserWarnings[reason], reason)
		}
		if r.VMResult != nil {
			for _, leak := range r.Leaks {
				fmt.Fprintf(w, "run %d: leaked VM %s\n", i+1, leak)
			}
		}
	}
}
