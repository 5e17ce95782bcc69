package devcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/dev/bench"
	"github.com/berth-ci/berth/internal/dev/testground/realtekton"
)

func newBenchCommand() *cobra.Command {
	var (
		scenario, controllerCmd, baseline, provisioner string
		logDir, plotPath, pprofDir, tekton             string
		scale, floorPace                               float64
		sweep                                          []float64
		install                                        []string
		asJSON, floor, safeFloor                       bool
		chaos                                          int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a multi-platform controller on a real control plane (make bench)",
		Long: `bench starts a real kube-apiserver and etcd, writes the scenario's host-config ConfigMap
(labelled build.appstudio.redhat.com/multi-platform-config, in namespace berth-system) and
host admin secret, and runs the controller under test as a child process with KUBECONFIG (a
cluster admin of its own, user bench-controller, so that the apiserver's audit log tells its
writes from everyone else's) and POD_NAMESPACE=berth-system. A simulation plays Tekton and
the hosts by the contract alone: it resolves user TaskRuns, completes a provision TaskRun (any
task-type=provision TaskRun, whatever Task it references: by creating the secret its
SECRET_NAME param names in NAMESPACE with host=USER@HOST, or, with berth's USER_NAME param,
with a user-dir result), completes clean and update TaskRuns, completes each user TaskRun 1-3 s
after its secret appears with a host, and fails it at once when its secret carries an error
(errorSecrets counts those). Every simulated host is also an SSH endpoint (pinned host key,
the admin secret's key) on port 22 of a loopback address of its own, named by its bare IP,
that answers berth's host commands at once, for a controller that provisions over SSH itself
(berth's default, --provisioner=ssh). Each result says which way the hosts were reached.

The config and secrets are valid for berth and for the upstream controller
(konflux-ci/multi-platform-controller) as it ships: hosts named s390x-NNN at bare IPs, their
admin secret host-admin-s390x (upstream wants an s390x host's secret to name the
architecture) labelled build.appstudio.redhat.com/multi-platform-secret=true (upstream reads
no other), concurrency at most 8. Any controller that keeps the contract can be measured like
for like; it must find its config by the label in $POD_NAMESPACE and need nothing else
installed. Run the upstream one with --baseline "<its binary> --metrics-bind-address=0
--health-probe-bind-address=0".

Scenarios: static (50 hosts x 4, 2,000 TaskRuns in a burst), idle-cluster (20,000
unrelated TaskRuns present, then 10 hosts x 2 and 100 TaskRuns: the controller's memory with
a big cluster), large (100,000 unrelated TaskRuns, 500 hosts x 8, 10,000 TaskRuns), dynamic
(a VM per task: 200 TaskRuns, max-instances 20) and dynamic-pool (VMs shared by 4 tasks
each: 2,000 TaskRuns, max-instances 12, max-age 2 h). --scale multiplies hosts, task counts,
unrelated TaskRuns and max-instances (at least 2); --sweep runs the scenario at each of
several scales and prints how the figures grow.

A run first serves a warm-up task, created as the controller starts; the measured part
begins once it has finished and ends once every task has finished and the controller made no
write for 2 s (at most 30 s). Limits are generous, for a slow controller: the warm-up 5 min
plus 50 ms per unrelated TaskRun, the measured part 5 min plus 2 s per task, and it ends
early after 5 min without a secret or a completion. A run cut short says why (incomplete)
and still reports what it measured: served of tasks, and all the rest. Every run keeps its
logs (the controller's, kube-apiserver's with its audit log, etcd's,
kube-controller-manager's) in a directory of its own under --log-dir, printed as it starts.

What a run reports:
  served, errorSecrets        tasks that got a host, tasks that got an error secret
  firstSecretSeconds          controller process start → the first secret of any task
  creationToSecretMs          a task's creation → its secret (p50, p90, p99, max)
  slotFreedToNextAllocationMs a task freeing a host slot while others wait → the next
                              task assigned to that host (seen by a watch of the
                              assigned-host label)
  allocationsPerSecond        served / (first task created → last secret)
  creationSeconds             first task created → last task created: how fast the harness
                              could create them here (no makespan is shorter)
  slotUtilisation             busy slot-seconds / offered slot-seconds: the sum over
                              served tasks of secret → completion, divided by slots x (first
                              task created → last task completed)
  apiWritesPerAllocation      every write the controller sent in the measured part / served
  apiWritesPerTaskNoWait,     the writes that belong to a task, averaged over finished tasks
  apiWritesPerTaskWaited      that never carried the waiting-for-platform label and over
                              those that did (tasksWaited), seen by a watch
  apiWritesOutsideTasks       writes of the measured part that belong to no task (config,
                              leases, BuildHost records, host checks)
  apiWritesByKind             resource and verb (e.g. "taskruns.tekton.dev patch") →
                              {total, noWaitTasks, waitedTasks, outsideTasks}
  eventsWritten               the controller's writes to Events in the measured part
  apiServerWriteMs            how long kube-apiserver took over each of those writes,
                              received → answered (audit log): a floor under any hand-over
  apiReadsByKind              the controller's gets and lists past its cache in the measured
                              part, by resource and verb (audit log)
  controllerPeakRssMiB, controllerCpuSeconds   from /proc, across chaos restarts
  controllerPeakRssAnonMiB,   the highest resident set sampled (every 50 ms), split into
  controllerPeakRssFileMiB    anonymous pages (heap, stacks) and file-backed ones (the
                              binary's and libraries' pages the controller touched)
  measuredCpuSeconds          CPU time over the measured part of kube-apiserver, etcd, the
                              controller and the harness (this process: simulation, simulated
                              hosts, watches), from /proc
  cpuMsPerTask                their sum per task served: what a task costs the machine
  stealSeconds                CPU time the host of this virtual machine took from its
                              processors over the measured part (/proc/stat's steal)
  apiStorageRequests          kube-apiserver's requests to etcd in the measured part by
                              operation and resource: an update retried on a conflict
                              counts once per try
  overcommitViolations        a host or VM ever assigned more tasks than its slots
  userTaskWarnings            Warning events on user TaskRuns by reason (none deserved)
Writes are counted from kube-apiserver's audit log of the controller's user (every create,
update, patch, delete and deletecollection, answered or refused). A write belongs to a task
when its object is the task's TaskRun, its secret, an object named by the TaskRun's UID
(berth's Allocation records), an internal TaskRun labelled with the task's name, or an Event
about one of those.

The dynamic scenarios start a local VM cloud in the bench process, whose VMs are real SSH
hosts (root, sshd, iproute2 and util-linux needed; about 1.5 s to boot), and configure the
platform as type local-vm on it (endpoint, its API key in Secret vm-cloud-credentials, key
api-key; ssh-secret host-admin-s390x, whose key the VMs accept for root; check-interval 1,
allocation-timeout 3600). They also report, from the cloud's own account of every instance:
instancesLaunched, peakInstances and maxInstancesExceeded (launches that took the platform
above max-instances), doubleLaunches (a launch token used twice, or a record's instance
launched while another of the same record was up), leakedInstances (up after the run and up
to 2 minutes of settling while no BuildHost record holds them, or their record is retired or
past max-age; pool VMs with a live record are not leaks), singleUseVmsReused and
vmReadyToSecretMs (from an instance becoming running in the cloud to the first secret of a
task assigned to it).

--chaos N kills the controller (SIGKILL) N times during the run, after random numbers of
served tasks plus up to a second, and starts it again at once with the same command;
controllerKills counts the kills. The cloud and the simulation live on.

--plot FILE.svg (or FILE.png) draws each run's creation→secret latency distribution (CDF)
beside its tasks served over time. --pprof DIR runs the bench's own controller, and the floor and
safe floor, with --pprof-bind-address and saves, for each run, its CPU profile over the
measured part (cpu.pprof) and its heap at the end (heap.pprof) in DIR/<run>/: go tool pprof
-top DIR/<run>/cpu.pprof, or -diff_base the safe floor's to see what berth spends beyond it.
For every run, the baseline's too, kube-apiserver's CPU profile over the measured part goes
beside them (kube-apiserver-cpu.pprof; read it with the test ground's kube-apiserver binary).

--floor runs the floor first on a static scenario: a calibration controller that writes
only the assigned-host label, the secret and the label's removal, serves in creation order
and keeps each host's concurrency. Its throughput and utilisation are about what this
machine allows; the controller's ratios to them are its own cost. The same requests cost
this machine more each when they come more slowly, so a controller slower than the floor is
also priced at a slower pace: --floor-pace N makes the floor assign at most N tasks a second
(give it the controller's allocations per second), and its CPU per task is then what the
machine spends at that pace on the floor's writes alone.

--safe-floor runs the safe floor before the controller: the floor's bookkeeping doing the
work berth cannot leave out and nothing else. It serves a task once Tekton has resolved it
(the contract's rule; the floor serves at creation). Per task it writes a record in berth-system
before touching the host, the labels (assigned host, target platform) with the contract's
finalizer, makes the build user with a fresh key over SSH (berth's host scripts), writes the
secret owned by its TaskRun; once the task is done it removes the user, takes the assigned
host and finalizer off and deletes the record: 5 writes and 2 SSH commands. Its rate is what
any controller doing that work reaches on this machine.
--floor-pace paces it too.

--tekton real runs a static scenario with Tekton's own controller and webhook in the loop
(built by make testbin, as in test/tekton), kube-scheduler placing their pods and kwok
playing the kubelet: Tekton resolves each user TaskRun and makes its pod, which starts once
its secret exists and ends after its run (1-3 s, drawn at creation). The simulation still
plays the internal TaskRuns (their steps do host work no kwok pod does). Tekton's own writes
of the measured part are counted apart. It takes root: the run goes into a network namespace
of its own, where Tekton's fixed ports are free. A controller that provisions in TaskRuns of
its own Tasks needs them installed for Tekton to run them: --install FILE,... creates the
objects of YAML files (the namespaced ones in berth-system) before each run's controller.

The command fails when any run was incomplete, after printing every result.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch tekton {
			case "simulated":
			case "real":
				if os.Geteuid() != 0 {
					return errors.New("--tekton real takes root: the run goes into a network namespace of its own, where Tekton's fixed ports are free")
				}
				// The whole command runs again there; this run only waits for it.
				if code, done := realtekton.IsolateNetwork(); done {
					os.Exit(code)
				}
			default:
				return fmt.Errorf("--tekton is simulated or real, not %q", tekton)
			}
			ownController := controllerCmd == ""
			if pprofDir != "" && !ownController {
				return errors.New("--pprof profiles the bench's own controller: leave out --controller")
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			if ownController {
				controllerCmd = bench.BerthController(ownBinary(self, scenario), provisioner)
			}
			switch {
			case floorPace != 0 && !floor && !safeFloor:
				return errors.New("--floor-pace paces the floor: give --floor or --safe-floor too")
			case floorPace < 0:
				return fmt.Errorf("--floor-pace %g: want tasks a second, or 0 for as fast as the floor can", floorPace)
			}
			scales := []float64{scale}
			if len(sweep) > 0 {
				scales = sweep
			}
			var scenarios []bench.Scenario
			for _, s := range scales {
				sc, err := bench.ScenarioNamed(scenario, s)
				if err != nil {
					return err
				}
				sc.Chaos = chaos
				switch {
				case (floor || safeFloor) && sc.MaxInstances > 0:
					return fmt.Errorf("--floor and --safe-floor serve static hosts only; %s runs on VMs", sc.Name)
				case (floor || safeFloor) && chaos > 0:
					return errors.New("the floors keep no state across a restart, so --chaos would make them over-commit: run them apart")
				}
				scenarios = append(scenarios, sc)
			}
			if logDir == "" {
				var err error
				if logDir, err = os.MkdirTemp("", "berth-bench-"); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "bench: the logs of every run are kept in %s\n", logDir)
			type controllerRun struct{ label, command string }
			runs := []controllerRun{{"controller", controllerCmd}}
			if baseline != "" {
				runs = []controllerRun{{"baseline", baseline}, runs[0]}
			}
			floorCmd := self + " " + floorCommandName
			if floorPace > 0 {
				floorCmd += fmt.Sprintf(" --pace=%g", floorPace)
			}
			if safeFloor {
				runs = append([]controllerRun{{"safe-floor", floorCmd + " --safe"}}, runs...)
			}
			if floor {
				runs = append([]controllerRun{{"floor", floorCmd}}, runs...)
			}
			labels := map[*bench.Result]string{}
			var results []*bench.Result
			for _, sc := range scenarios {
				for _, run := range runs {
					name := fmt.Sprintf("%s-%g-%s", sc.Name, sc.Scale, run.label)
					o := bench.Options{Controller: run.command, LogDir: filepath.Join(logDir, name), Log: cmd.ErrOrStderr(), RealTekton: tekton == "real", Install: install}
					switch {
					case pprofDir != "" && (run.label == "controller" || strings.HasSuffix(run.label, "floor")):
						addr, err := bench.FreeLoopbackAddress()
						if err != nil {
							return err
						}
						o.Controller += " --pprof-bind-address=" + addr
						o.Pprof = &bench.Pprof{Address: addr, Dir: filepath.Join(pprofDir, name)}
					case pprofDir != "":
						// Another controller serves no pprof: kube-apiserver's profile alone.
						o.Pprof = &bench.Pprof{Dir: filepath.Join(pprofDir, name)}
					}
					res, err := bench.Run(cmd.Context(), sc, o)
					if err != nil {
						return fmt.Errorf("%s: %w", run.command, err)
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "  served %d of %d tasks, %d error secrets\n", res.Served, res.Tasks, res.ErrorSecrets)
					if res.Incomplete != "" {
						fmt.Fprintf(cmd.ErrOrStderr(), "  incomplete: %s\n", res.Incomplete)
					}
					labels[res] = fmt.Sprintf("%s, scale %g", run.label, sc.Scale)
					results = append(results, res)
				}
			}
			switch {
			case asJSON:
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(results); err != nil {
					return err
				}
			case len(sweep) > 0:
				bench.PrintSweep(cmd.OutOrStdout(), results)
			default:
				bench.PrintTable(cmd.OutOrStdout(), results)
			}
			if plotPath != "" {
				if err := bench.WritePlot(plotPath, results, func(r *bench.Result) string { return labels[r] }); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "bench: plot in %s\n", plotPath)
			}
			var incomplete []string
			for _, r := range results {
				if r.Incomplete != "" {
					incomplete = append(incomplete, labels[r])
				}
			}
			if len(incomplete) > 0 {
				return fmt.Errorf("incomplete runs: %s (see above)", strings.Join(incomplete, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenario, "scenario", "static", strings.Join(bench.ScenarioNames, ", "))
	f.Float64Var(&scale, "scale", 1, "multiply the scenario's hosts and task counts (0.1 for a quick run)")
	f.Float64SliceVar(&sweep, "sweep", nil, "run the scenario at each of these scales (e.g. 0.05,0.1,0.25) and print how the figures grow; overrides --scale")
	f.StringVar(&controllerCmd, "controller", "", "command line of the controller under test (default: the production berth beside berth-dev; berth-dev's own controller, berth's plus the local-vm provider, for the dynamic scenarios or when there is no berth beside it)")
	f.StringVar(&baseline, "baseline", "", "command line of another controller to run first on the same scenario, for ratios")
	f.Float64Var(&floorPace, "floor-pace", 0, "with --floor: the floor makes at most this many assignments a second, to price this machine's work at a slower controller's pace (give the controller's allocations per second)")
	f.BoolVar(&safeFloor, "safe-floor", false, "run the safe floor before the controller (static hosts only): the floor's writes plus the work berth cannot leave out (a record per assignment, the finalizer, a build user made and removed over SSH), to tell that work's cost from the rest of the controller's")
	f.BoolVar(&floor, "floor", false, "run the floor first on the same scenario (static hosts only): the fewest writes a controller can make, to tell this machine's limits from the controller's")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	f.IntVar(&chaos, "chaos", 0, "kill the controller (SIGKILL) this many times at random moments of the run, starting it again at once")
	f.StringVar(&provisioner, "provisioner", "ssh", "how this berth's controller reaches the hosts: ssh or taskrun (ignored with --controller)")
	f.StringVar(&logDir, "log-dir", "", "keep each run's logs in a directory of its own under this one (default: a new temporary directory, printed at the start)")
	f.StringSliceVar(&install, "install", nil, "YAML files whose objects every run creates before its controller starts, the namespaced ones in berth-system: a baseline's own Tasks, which real Tekton must find to run its internal TaskRuns")
	f.StringVar(&tekton, "tekton", "simulated", "what runs the user TaskRuns: simulated (the contract's simulation) or real (Tekton's own controller, with kwok pods; static scenarios, root)")
	f.StringVar(&plotPath, "plot", "", "draw each run's latency distribution and tasks served over time into this SVG or PNG file")
	f.StringVar(&pprofDir, "pprof", "", "save the CPU profile of the measured part and the heap at the end of the bench's own controller and floors, each run in a directory of its own under this one")
	return cmd
}

// floorCommandName is the hidden command that runs the floor as a child process of bench.
const floorCommandName = "bench-floor"

func newFloorCommand() *cobra.Command {
	var (
		pace      float64
		safe      bool
		pprofAddr string
	)
	cmd := &cobra.Command{
		Use:    floorCommandName,
		Short:  "The bench's floor: a calibration controller for --floor, not for use",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := ctrl.GetConfig()
			if err != nil {
				return err
			}
			// berth's shipped client limits, so that the floor is throttled as berth is.
			cfg.QPS, cfg.Burst = cli.DefaultKubeAPIQPS, cli.DefaultKubeAPIBurst
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if pprofAddr != "" {
				if err := serveProfiles(ctx, pprofAddr); err != nil {
					return err
				}
			}
			err = bench.RunFloor(ctx, cfg, os.Getenv("POD_NAMESPACE"), bench.FloorOptions{Pace: pace, Safe: safe}, cmd.ErrOrStderr())
			if ctx.Err() != nil {
				return nil
			}
			return err
		},
	}
	cmd.Flags().Float64Var(&pace, "pace", 0, "assignments a second at most (0: as fast as it can)")
	cmd.Flags().BoolVar(&safe, "safe", false, "the safe floor: records, the finalizer and build users over SSH besides")
	cmd.Flags().StringVar(&pprofAddr, "pprof-bind-address", "", "address of Go's profiler endpoints (/debug/pprof/), as the controller's flag: --pprof profiles the floor too")
	return cmd
}

// serveProfiles serves Go's profiler endpoints at addr until ctx ends, as the controller's
// manager does with --pprof-bind-address, so that the bench profiles the floor like berth.
func serveProfiles(ctx context.Context, addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() { _ = srv.Serve(l) }()
	return nil
}

// ownBinary is the binary of the controller the bench runs when no --controller is given: the
// production berth beside berth-dev (productionBerth; make build puts both in bin/), which is
// what a cluster runs and what the figures are about: berth-dev carries the test ground
// besides, which its memory shows. The dynamic scenarios, whose platforms are of type
// local-vm, take berth-dev's controller (self): only it has that provider. So does a berth-dev
// with no berth beside it (go run, say).
func ownBinary(self, scenario string) string {
	if sc, err := bench.ScenarioNamed(scenario, 1); err != nil || sc.MaxInstances > 0 {
		return self
	}
	production, err := productionBerth(filepath.Join(filepath.Dir(self), "berth"))
	if err != nil {
		return self
	}
	return production
}
