package bench

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
)

// PrintTable writes results side by side, and with two results, their ratio (second/first);
// then, for each run, where the controller's writes went.
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
	row("tasks", func(r *Result) float64 { return float64(r.Tasks) }, "%.0f")
	row("tasks served", func(r *Result) float64 { return float64(r.Served) }, "%.0f")
	row("tasks given an error secret", func(r *Result) float64 { return float64(r.ErrorSecrets) }, "%.0f")
	row("controller start→first secret s", func(r *Result) float64 { return r.FirstSecretSeconds }, "%.1f")
	row("creation→secret p50 ms", func(r *Result) float64 { return r.SecretLatency.P50 }, "%.1f")
	row("creation→secret p90 ms", func(r *Result) float64 { return r.SecretLatency.P90 }, "%.1f")
	row("creation→secret p99 ms", func(r *Result) float64 { return r.SecretLatency.P99 }, "%.1f")
	row("creation→secret max ms", func(r *Result) float64 { return r.SecretLatency.Max }, "%.1f")
	row("slot freed→next allocation p50 ms", func(r *Result) float64 { return r.HandOver.P50 }, "%.1f")
	row("slot freed→next allocation p99 ms", func(r *Result) float64 { return r.HandOver.P99 }, "%.1f")
	row("makespan s", func(r *Result) float64 { return r.MakespanSeconds }, "%.1f")
	row("tasks created over s", func(r *Result) float64 { return r.CreationSeconds }, "%.1f")
	row("allocations per second", func(r *Result) float64 { return r.AllocationsPerSec }, "%.1f")
	row("slot utilisation", func(r *Result) float64 { return r.SlotUtilisation }, "%.2f")
	row("API writes per allocation", func(r *Result) float64 { return r.WritesPerAllocation }, "%.1f")
	row("API writes per task that never waited", func(r *Result) float64 { return r.WritesPerTaskNoWait }, "%.1f")
	row("API writes per task that waited", func(r *Result) float64 { return r.WritesPerTaskWaited }, "%.1f")
	row("tasks that waited", func(r *Result) float64 { return float64(r.TasksWaited) }, "%.0f")
	row("API writes outside tasks", func(r *Result) float64 { return float64(r.WritesOutsideTasks) }, "%.0f")
	row("Events written", func(r *Result) float64 { return float64(r.EventsWritten) }, "%.0f")
	if slices.ContainsFunc(results, func(r *Result) bool { return r.Tekton != "" }) {
		row("Tekton's own writes (real Tekton)", func(r *Result) float64 { return float64(r.TektonWrites) }, "%.0f")
		row("Tekton's writes to unrelated TaskRuns", func(r *Result) float64 { return float64(r.TektonHistoryWrites) }, "%.0f")
	}
	row("apiserver time per write p50 ms", func(r *Result) float64 { return r.ServerWriteTime.P50 }, "%.1f")
	row("apiserver time per write p99 ms", func(r *Result) float64 { return r.ServerWriteTime.P99 }, "%.1f")
	row("controller peak RSS MiB", func(r *Result) float64 { return r.PeakRSSMiB }, "%.1f")
	row("  of it anonymous (heap, stacks) MiB", func(r *Result) float64 { return r.PeakRSSAnonMiB }, "%.1f")
	row("  of it file-backed (binary, libraries) MiB", func(r *Result) float64 { return r.PeakRSSFileMiB }, "%.1f")
	row("controller CPU s", func(r *Result) float64 { return r.CPUSeconds }, "%.1f")
	for _, p := range []string{"kube-apiserver", "etcd", "controller", "harness"} {
		row(p+" CPU s, measured part", func(r *Result) float64 { return r.MeasuredCPUSeconds[p] }, "%.1f")
	}
	row("CPU per task served ms (all four)", func(r *Result) float64 { return r.CPUMsPerTask }, "%.1f")
	row("CPU s taken by the host (steal), measured part", func(r *Result) float64 { return r.StealSeconds }, "%.1f")
	row("over-commit violations", func(r *Result) float64 { return float64(r.Violations) }, "%.0f")
	row("controller kills", func(r *Result) float64 { return float64(r.ControllerKills) }, "%.0f")
	row("warnings on user tasks", func(r *Result) float64 { return float64(r.userWarnings()) }, "%.0f")
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
		fmt.Fprintf(w, "run %d: %s, scenario %s at scale %g, hosts reached by %s, logs in %s\n", i+1, r.Controller, r.Scenario, r.Scale, r.Provisioner, r.LogDir)
		if r.Incomplete != "" {
			fmt.Fprintf(w, "run %d INCOMPLETE: %s\n", i+1, r.Incomplete)
		}
		for _, reason := range slices.Sorted(maps.Keys(r.UserWarnings)) {
			fmt.Fprintf(w, "run %d: %d Warning events %s on user tasks\n", i+1, r.UserWarnings[reason], reason)
		}
		if r.VMResult != nil {
			for _, leak := range r.Leaks {
				fmt.Fprintf(w, "run %d: leaked VM %s\n", i+1, leak)
			}
		}
	}
	for i, r := range results {
		printWritesByKind(w, fmt.Sprintf("run %d", i+1), r)
	}
}

// printWritesByKind writes where a run's controller writes went, most first.
func printWritesByKind(w io.Writer, name string, r *Result) {
	if len(r.WritesByKind) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s: the controller's writes by kind\n", name)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\tin the measured part\tper task that never waited\tper task that waited\toutside tasks\t")
	kinds := slices.SortedFunc(maps.Keys(r.WritesByKind), func(a, b string) int {
		return cmp.Or(cmp.Compare(r.WritesByKind[b].Total, r.WritesByKind[a].Total), cmp.Compare(a, b))
	})
	noWait, waited := r.finishedTasks()
	for _, kind := range kinds {
		k := r.WritesByKind[kind]
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%d\t\n", kind, k.Total, mean(k.NoWaitTasks, noWait), mean(k.WaitedTasks, waited), k.OutsideTasks)
	}
	tw.Flush()
	if len(r.ReadsByKind) > 0 {
		fmt.Fprintf(w, "%s: the controller's reads past its cache\n", name)
		for _, kind := range slices.Sorted(maps.Keys(r.ReadsByKind)) {
			fmt.Fprintf(w, "  %s\t%d\n", kind, r.ReadsByKind[kind])
		}
	}
}

// finishedTasks is how many measured tasks finished without waiting and after waiting.
func (r *Result) finishedTasks() (noWait, waited int) {
	finished := 0
	for _, t := range r.Timeline.Tasks {
		if !t.Done.IsZero() {
			finished++
		}
	}
	return finished - r.TasksWaited, r.TasksWaited
}

func (r *Result) userWarnings() int {
	n := 0
	for _, c := range r.UserWarnings {
		n += c
	}
	return n
}

// PrintSweep writes how each controller's figures grow with the scenario's scale: a row per
// run, in the order run.
func PrintSweep(w io.Writer, results []*Result) {
	var controllers []string
	for _, r := range results {
		if !slices.Contains(controllers, r.Controller) {
			controllers = append(controllers, r.Controller)
		}
	}
	for _, c := range controllers {
		fmt.Fprintf(w, "\n%s\n", c)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "scale\ttasks\tslots\tunrelated\tserved\tallocations/s\tslot utilisation\thand-over p99 ms\tsecret p99 ms\tfirst secret s\tpeak RSS MiB\twrites/task no wait\twrites/task waited\twrites/allocation\t")
		for _, r := range results {
			if r.Controller != c {
				continue
			}
			served := fmt.Sprint(r.Served)
			if r.Incomplete != "" {
				served += " (incomplete)"
			}
			fmt.Fprintf(tw, "%g\t%d\t%d\t%d\t%s\t%.1f\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", r.Scale, r.Tasks, r.Slots, r.Unrelated, served,
				r.AllocationsPerSec, r.SlotUtilisation, r.HandOver.P99, r.SecretLatency.P99, r.FirstSecretSeconds, r.PeakRSSMiB, r.WritesPerTaskNoWait, r.WritesPerTaskWaited, r.WritesPerAllocation)
		}
		tw.Flush()
	}
}
