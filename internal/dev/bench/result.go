package bench

import (
	"slices"
	"time"
)

// Result is what one run measured. The measured part begins once the warm-up task (created
// as the controller starts) has finished, and ends once the controller, every task done,
// made no write for a while.
type Result struct {
	Controller string  `json:"controller"`
	Scenario   string  `json:"scenario"`
	Scale      float64 `json:"scale"`
	Tasks      int     `json:"tasks"`
	// Slots is how many tasks the platform runs at once (hosts or VMs times concurrency).
	Slots int `json:"slots"`
	// Unrelated is how many TaskRuns of no concern to the controller were present.
	Unrelated int `json:"unrelatedTaskRuns"`
	// Served is how many of the tasks got a secret with a host; ErrorSecrets how many got
	// one with an error instead (the simulation fails those tasks at once).
	Served       int `json:"served"`
	ErrorSecrets int `json:"errorSecrets"`
	// Incomplete says why the run ended before every task was served or failed (a phase
	// timed out, the controller died); what it measured until then is still reported.
	Incomplete string `json:"incomplete,omitempty"`
	// LogDir keeps the run's logs: the controller's, kube-apiserver's with its audit log of
	// the controller's writes, etcd's and kube-controller-manager's.
	LogDir string `json:"logDir"`
	// FirstSecretSeconds is from the controller's process start to the first secret of a
	// task (the warm-up task is created as the controller starts).
	FirstSecretSeconds float64     `json:"firstSecretSeconds"`
	SecretLatency      Percentiles `json:"creationToSecretMs"`
	HandOver           Percentiles `json:"slotFreedToNextAllocationMs"`
	MakespanSeconds    float64     `json:"makespanSeconds"`
	// CreationSeconds is from the first task's creation to the last's: how fast the harness
	// could create them on this machine. No controller's makespan is shorter than this plus
	// the last task's run, which bounds slotUtilisation whatever the controller.
	CreationSeconds     float64 `json:"creationSeconds"`
	AllocationsPerSec   float64 `json:"allocationsPerSecond"`
	SlotUtilisation     float64 `json:"slotUtilisation"`
	WritesPerAllocation float64 `json:"apiWritesPerAllocation"`
	// WritesPerTaskNoWait and WritesPerTaskWaited are the controller's writes per finished
	// task, apart for tasks that never carried the waiting-for-platform label and those that
	// did (TasksWaited of them).
	WritesPerTaskNoWait float64 `json:"apiWritesPerTaskNoWait"`
	WritesPerTaskWaited float64 `json:"apiWritesPerTaskWaited"`
	TasksWaited         int     `json:"tasksWaited"`
	// WritesOutsideTasks is the controller's writes of the measured part that belong to no
	// task; WritesByKind says where all of them went; EventsWritten counts those to Events.
	WritesOutsideTasks int                   `json:"apiWritesOutsideTasks"`
	WritesByKind       map[string]KindWrites `json:"apiWritesByKind"`
	EventsWritten      int                   `json:"eventsWritten"`
	// ServerWriteTime is how long kube-apiserver took over each write of the controller in
	// the measured part, from receiving it to answering (its audit log's two timestamps). A
	// hand-over waits for at least one write, so on a loaded machine its p50 and p99 are a
	// floor under slotFreedToNextAllocationMs that no controller can go below.
	ServerWriteTime Percentiles `json:"apiServerWriteMs"`
	// ReadsByKind counts the controller's gets and lists in the measured part by resource
	// and verb (e.g. "secrets get"), from the same audit log: reads past its cache.
	ReadsByKind map[string]int `json:"apiReadsByKind"`
	// MeasuredCPUSeconds is the CPU time each process used over the measured part (warm-up
	// done → every task finished and quiet): kube-apiserver, etcd, the controller, and the
	// harness (the simulation, the simulated hosts, the watches that time the tasks). With
	// real Tekton, Tekton's processes are not in it. CPUMsPerTask is their sum per task
	// served: what one task costs the machine, controller and apiserver together.
	MeasuredCPUSeconds map[string]float64 `json:"measuredCpuSeconds"`
	CPUMsPerTask       float64            `json:"cpuMsPerTask"`
	// StealSeconds is the time the host of this virtual machine kept its processors from
	// running over the measured part, all processors together (/proc/stat; see steal.go); 0
	// on a machine that does not tell. Beside makespan × processors it says how much of the
	// run its neighbours took.
	StealSeconds float64 `json:"stealSeconds"`
	// StorageRequests counts kube-apiserver's requests to etcd in the measured part by
	// operation and resource (see storageCounters): an update it retried on a conflict
	// counts once per try, so beside the audit log's writes it shows the retries.
	StorageRequests map[string]float64 `json:"apiStorageRequests"`
	// Tekton is what ran the user TaskRuns: "" for the simulation, "real <version>" for
	// Tekton's own controller (Options.RealTekton), whose writes of the measured part
	// TektonWrites counts, apart from the controller's.
	Tekton       string `json:"tekton,omitempty"`
	TektonWrites int    `json:"tektonWrites,omitempty"`
	// TektonHistoryWrites counts real Tekton's writes, over the whole run, in the namespace of
	// the unrelated TaskRuns, which it finds finished: more than 0 says that the history was
	// not history to it, and that its pace was spent there.
	TektonHistoryWrites int `json:"tektonHistoryWrites,omitempty"`
	// Provisioner is how the controller reached the hosts: ssh (from its own process) or
	// taskrun (provision TaskRuns the simulation completed).
	Provisioner string `json:"provisioner"`
	// HostAddresses is how the config names the simulated hosts: bare IPs (each host on port
	// 22 of a loopback address of its own), or IP:port where port 22 could not be had.
	HostAddresses string  `json:"hostAddresses"`
	PeakRSSMiB    float64 `json:"controllerPeakRssMiB"`
	// PeakRSSAnonMiB and PeakRSSFileMiB split the highest resident set sampled (every 50 ms,
	// so a little under PeakRSSMiB): anonymous pages (the heap, stacks, the runtime's own) and
	// file-backed ones (the pages of its binary and libraries it touched). Two controllers'
	// peaks differ in either for different reasons: what they keep, or how much code they run.
	PeakRSSAnonMiB float64 `json:"controllerPeakRssAnonMiB"`
	PeakRSSFileMiB float64 `json:"controllerPeakRssFileMiB"`
	CPUSeconds     float64 `json:"controllerCpuSeconds"`
	Violations     int     `json:"overcommitViolations"`
	// ControllerKills is how many times chaos killed the controller during the run.
	ControllerKills int `json:"controllerKills"`
	// UserWarnings counts the Warning events on user TaskRuns by reason. Nothing in a run
	// deserves one (no tenant edits anything, every host works): any is worth a look.
	UserWarnings map[string]int `json:"userTaskWarnings"`
	// VMResult is set on a VM platform; its fields are at the top level of the JSON.
	*VMResult

	// Timeline is each measured task's times, for plots.
	Timeline Timeline `json:"-"`
}

// Timeline is when each measured task was created, got its secret and finished, from Start,
// the first task's creation.
type Timeline struct {
	Start time.Time
	Tasks []TaskTimes
}

// TaskTimes are one task's moments; Secret and Done are zero when they did not happen, and
// Error says the secret carried an error.
type TaskTimes struct {
	Created, Secret, Done time.Time
	Error                 bool
}

// served are the tasks that got a host.
func (t Timeline) served() []TaskTimes {
	var out []TaskTimes
	for _, task := range t.Tasks {
		if !task.Secret.IsZero() && !task.Error {
			out = append(out, task)
		}
	}
	return out
}

// slotUtilisation is the busy slot-seconds (for every served task that finished, from its
// secret to its completion) over what the slots offered from the first task's creation to the
// last task's completion.
func (t Timeline) slotUtilisation(slots int) float64 {
	var busy time.Duration
	var last time.Time
	for _, task := range t.Tasks {
		last = maxTime(last, task.Done)
		if !task.Error && !task.Secret.IsZero() && !task.Done.IsZero() {
			busy += task.Done.Sub(task.Secret)
		}
	}
	span := last.Sub(t.Start)
	if slots <= 0 || span <= 0 {
		return 0
	}
	return busy.Seconds() / (float64(slots) * span.Seconds())
}

// Percentiles of a latency, in milliseconds.
type Percentiles struct {
	P50, P90, P99, Max float64
	N                  int
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	return Percentiles{P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: at(1), N: len(d)}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
