package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/rest"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realtekton"
	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

const (
	controllerNamespace = "berth-system"
	userNamespace       = "bench"
	unrelatedNamespace  = "unrelated"
	benchPlatform       = "linux/s390x"
	// adminSecret holds the hosts' (and the VMs') admin key. The upstream controller takes
	// the admin secret of an s390x or ppc64le host only when its name names the
	// architecture, and reads only Secrets labelled multi-platform-secret.
	adminSecret = "host-admin-s390x"
	// controllerUser is the controller's own identity on the control plane (a cluster
	// admin), by which the audit log tells its writes from the harness's and the
	// simulation's.
	controllerUser = "bench-controller"

	// tektonUser is real Tekton's identity (Options.RealTekton), whose writes are counted
	// apart.
	tektonUser = "bench-tekton"
	warmUpTask = "warm-up"
)

// readVerbs are the controller's requests the audit log records besides its writes.
var readVerbs = []string{"get", "list"}

// Options say how to run a controller on a scenario.
type Options struct {
	// Controller is the command line of the controller under test.
	Controller string
	// LogDir receives the run's logs and is kept; a new temporary directory when empty.
	LogDir string
	// Pprof, if set, collects the controller's profiles from its pprof endpoint.
	Pprof *Pprof
	// Log receives progress lines.
	Log io.Writer
	// Install are YAML files whose objects are created before the controller starts, the
	// namespaced ones in the controller's namespace: what a controller needs installed beside
	// it, such as the Tasks of the internal TaskRuns it makes (real Tekton runs only TaskRuns
	// whose Task it finds).
	Install []string
	// RealTekton runs the scenario with Tekton's own controller and webhook in the loop
	// (realtekton: kube-scheduler places their pods, kwok plays the kubelet and ends each
	// task's pod after its run), in place of the simulation of user TaskRuns. Static
	// scenarios only; it must run in realtekton's network namespace (IsolateNetwork).
	RealTekton bool
}

// Run measures one controller on one scenario, on a control plane of its own. An error means
// the run could not be set up; a run that was cut short returns its Result with Incomplete
// saying why.
func Run(ctx context.Context, sc Scenario, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	dir := o.LogDir
	var err error
	if dir == "" {
		dir, err = os.MkdirTemp("", "berth-bench-")
	} else {
		dir, err = freshDir(dir)
	}
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "%s\n  controller: %s\n  logs: %s\n", sc.describe(), o.Controller, dir)
	r := &run{sc: sc, o: o, dir: dir, auditPath: filepath.Join(dir, "audit.log"),
		created: map[string]time.Time{}, secretAt: map[string]time.Time{}, errorAt: map[string]time.Time{},
		doneAt: map[string]time.Time{}, owners: owners{}}
	return r.run(ctx)
}

// freshDir makes dir, or dir-2, dir-3, … when an earlier run left its logs there: a run's
// writes are counted from its audit log, which kube-apiserver appends to.
func freshDir(dir string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	for n := 1; ; n++ {
		try := dir
		if n > 1 {
			try = fmt.Sprintf("%s-%d", dir, n)
		}
		switch err := os.Mkdir(try, 0o755); {
		case err == nil:
			return try, nil
		case !os.IsExist(err):
			return "", err
		}
	}
}

// run is one run's state.
type run struct {
	sc        Scenario
	o         Options
	dir       string
	auditPath string

	cp      *controlplane.ControlPlane
	cfg     *rest.Config
	c       client.WithWatch
	answers hostAnswers
	cloud   *vmcloud.Cloud
	sim     *Tekton
	tekton  *realtekton.Tekton // with Options.RealTekton
	chk     *hostChecker
	ctrl    *controllerProcess

	mu                                 sync.Mutex
	created, secretAt, errorAt, doneAt map[string]time.Time
	owners                             owners
	progress                           time.Time
}

func (r *run) run(ctx context.Context) (*Result, error) {
	if r.o.RealTekton && r.sc.vms() {
		return nil, fmt.Errorf("scenario %s runs on VMs; real Tekton is benched on the static scenarios only", r.sc.Name)
	}
	cpOpts := []controlplane.Option{controlplane.WithLogDir(r.dir)}
	audited := []string{controllerUser}
	if r.o.RealTekton {
		tekton, err := realtekton.ControlPlaneOptions()
		if err != nil {
			return nil, err
		}
		cpOpts, audited = append(cpOpts, tekton...), append(audited, tektonUser)
	}
	// The controller's reads too (get and list; a watch is one long request), to tell what
	// each task costs the apiserver besides its writes.
	cpOpts = append(cpOpts, controlplane.WithAuditPolicy(r.auditPath,
		auditv1.PolicyRule{Level: auditv1.LevelMetadata, Verbs: readVerbs, Users: []string{controllerUser}},
		auditv1.PolicyRule{Level: auditv1.LevelMetadata, Verbs: controlplane.MutatingVerbs, Users: audited}))
	var err error
	r.cp, err = controlplane.Start(cpOpts...)
	if err != nil {
		return nil, err
	}
	defer r.cp.Stop()
	// The harness must never be what throttles the run: no client-side rate limit for it.
	r.cfg = rest.CopyConfig(r.cp.Config)
	r.cfg.QPS, r.cfg.Burst = -1, 0
	if r.c, err = client.NewWithWatch(r.cfg, client.Options{Scheme: controlplane.Scheme()}); err != nil {
		return nil, err
	}
	// Before Tekton starts, so that real Tekton finds them finished.
	if err := r.createUnrelated(ctx); err != nil {
		return nil, err
	}
	if r.o.RealTekton {
		if r.tekton, err = realtekton.Start(ctx, r.cp, realtekton.AsUser(tektonUser)); err != nil {
			return nil, err
		}
		// Stopped before the control plane, after the controller.
		defer r.tekton.Stop()
		fmt.Fprintf(r.o.Log, "  Tekton %s runs the user TaskRuns; kwok plays their pods\n", r.tekton.Version())
	}
	hosts, addressing, err := startHosts(r.sc.Hosts, r.answers.answer)
	if err != nil {
		return nil, err
	}
	defer hosts.Close()
	if addressing != bareIPs {
		fmt.Fprintf(r.o.Log, "  warning: the simulated hosts are named IP:port in the config (%s); a controller that takes bare IPs only (the upstream one) cannot read it\n", addressing)
	}
	var cloudKey string
	if r.sc.vms() {
		var stopCloud func() error
		r.cloud, cloudKey, stopCloud, err = startCloud(hosts.AdminKey, filepath.Join(r.dir, "vmcloud.log"))
		if err != nil {
			return nil, err
		}
		// Deferred before the controller starts, so it stops after the controller.
		defer stopCloud()
	}
	if err := r.setUp(ctx, hosts, cloudKey); err != nil {
		return nil, err
	}
	if r.tekton != nil {
		// Tekton runs a TaskRun as its namespace's default ServiceAccount, and fails it at once
		// if there is none yet.
		if err := r.tekton.EnsureNamespace(ctx, userNamespace); err != nil {
			return nil, err
		}
	}
	kubeconfig, err := r.cp.KubeConfigAs(controllerUser, "system:masters")
	if err != nil {
		return nil, err
	}
	kubeconfigPath := filepath.Join(r.dir, "controller.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}

	// The simulation and the checker watch from before the controller starts.
	simCtx, stopSim := context.WithCancel(ctx)
	defer stopSim()
	r.sim = &Tekton{Client: r.c, Namespace: userNamespace, ControllerNamespace: controllerNamespace, Duration: Uniform(r.sc.MinRun, r.sc.MaxRun),
		OnSecret:   r.at(r.secretAt),
		OnError:    r.at(r.errorAt),
		OnDone:     r.at(r.doneAt),
		OnInternal: func(name, task string) { r.mu.Lock(); r.owners.add(name, task); r.mu.Unlock() },
		Real:       r.tekton != nil,
	}
	go func() { _ = r.sim.Run(simCtx, r.cfg) }()
	r.chk, err = watchHosts(simCtx, r.c, r.sc.Concurrency, r.waiting)
	if err != nil {
		return nil, err
	}

	res := &Result{Controller: r.o.Controller, Scenario: r.sc.Name, Scale: r.sc.Scale, Tasks: r.sc.Tasks, Slots: r.sc.slots(),
		Unrelated: r.sc.Unrelated, LogDir: r.dir, HostAddresses: string(addressing)}
	r.ctrl, err = startController(r.o.Controller, kubeconfigPath, filepath.Join(r.dir, "controller.log"))
	if err != nil {
		return nil, err
	}
	defer r.ctrl.stop()
	from, start, err := r.measure(ctx, res)
	if err != nil {
		return nil, err
	}
	if err := r.report(ctx, res, from, start); err != nil {
		return nil, err
	}
	return res, nil
}

// at records, in m, when something happened to a task, and that the run progressed.
func (r *run) at(m map[string]time.Time) func(string, time.Time) {
	return func(task string, t time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		m[task] = t
		r.progress = maxTime(r.progress, t)
	}
}

// waiting is how many measured tasks have no secret yet.
func (r *run) waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.created) - len(r.secretAt) - len(r.errorAt)
	for _, at := range []map[string]time.Time{r.secretAt, r.errorAt} {
		if _, warm := at[warmUpTask]; warm {
			n++
		}
	}
	return n
}

// finished is how many tasks (the warm-up among them) have completed.
func (r *run) finished() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.doneAt)
}

// measure runs the warm-up and the measured part. It returns when the measured part began (the
// warm-up done) and when its first task was created; zero times when it never began. A phase
// that runs out of time sets res.Incomplete.
func (r *run) measure(ctx context.Context, res *Result) (from, start time.Time, err error) {
	// Warm-up: one task served means the controller has synced its caches and read its config.
	warm := r.userTask(warmUpTask)
	if err := r.createTask(ctx, warm, false); err != nil {
		return from, start, err
	}
	warmLimit := r.sc.warmUpLimit()
	err = waitFor(ctx, warmLimit, func() bool {
		if _, dead := r.ctrl.died(); dead {
			return true
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return !r.doneAt[warmUpTask].IsZero()
	})
	if r.incomplete(res, err, fmt.Sprintf("the warm-up task did not finish in %s", warmLimit)) {
		return from, start, ctx.Err()
	}
	from = time.Now()
	cpuFrom := r.cpuNow()
	stealFrom, stealKnown := stealSeconds()
	apiServer, err := apiServerGetter(r.cfg)
	if err != nil {
		return from, start, err
	}
	storageFrom, storageErr := storageCounters(ctx, apiServer)
	var pprof *profiling
	if r.o.Pprof != nil {
		pprof = r.o.Pprof.start(ctx, apiServer)
	}

	chaosCtx, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	chaosDone := make(chan error, 1)
	go func() {
		points := chaosPoints(r.sc.Chaos, r.sc.Tasks, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
		chaosDone <- runChaos(chaosCtx, r.ctrl, points, func() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.secretAt) - 1 }, r.o.Log)
	}()
	start = time.Now()
	err = parallel(r.sc.Tasks, 8, func(i int) error {
		return r.createTask(ctx, r.userTask(fmt.Sprintf("task-%05d", i)), true)
	})
	if err != nil {
		return from, start, err
	}
	limit := r.sc.runLimit()
	r.mu.Lock()
	r.progress = time.Now()
	r.mu.Unlock()
	stalled := false
	waitErr := waitFor(ctx, limit, func() bool {
		if _, dead := r.ctrl.died(); dead {
			return true
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		stalled = time.Since(r.progress) > stallLimit
		return stalled || len(r.doneAt) >= r.sc.Tasks+1
	})
	stopChaos()
	chaosErr := <-chaosDone
	switch {
	case stalled:
		r.incomplete(res, errors.New("stalled"), fmt.Sprintf("no task got a secret or finished for %s; %d tasks had no secret",
			stallLimit, r.waiting()))
	case r.incomplete(res, waitErr, fmt.Sprintf("%d of %d tasks finished in %s", r.finished()-1, r.sc.Tasks, limit)):
	case chaosErr != nil:
		res.Incomplete = fmt.Sprintf("restarting the killed controller: %v (its log: %s)", chaosErr, r.ctrl.logPath)
	}
	if ctx.Err() != nil {
		return from, start, ctx.Err()
	}
	r.quiesce(ctx)
	res.MeasuredCPUSeconds = grown(cpuFrom, r.cpuNow())
	if stealTo, ok := stealSeconds(); ok && stealKnown {
		res.StealSeconds = stealTo - stealFrom
	}
	if storageErr == nil {
		var storageTo map[string]float64
		if storageTo, storageErr = storageCounters(ctx, apiServer); storageErr == nil {
			res.StorageRequests = grown(storageFrom, storageTo)
		}
	}
	if storageErr != nil {
		fmt.Fprintf(r.o.Log, "  warning: kube-apiserver's storage counters: %v\n", storageErr)
	}
	if pprof != nil {
		if err := pprof.finish(ctx); err != nil {
			fmt.Fprintf(r.o.Log, "  warning: profiling the controller: %v\n", err)
		}
	}
	return from, start, nil
}

// cpuNow is the CPU time used so far by kube-apiserver, etcd, the controller (the running one
// and those killed before it) and the harness (this process: the simulation, the simulated
// hosts and the watches that time the tasks).
func (r *run) cpuNow() map[string]float64 {
	cpu := r.cp.CPUSeconds()
	cpu["controller"] = r.ctrl.usage().cpuSeconds
	if self, ok := controlplane.ProcessCPUSeconds("self"); ok {
		cpu["harness"] = self
	}
	return cpu
}

// incomplete records why a phase ended short, when it did: the controller died, or err (the
// wait's) says what. It tells whether the phase ended short.
func (r *run) incomplete(res *Result, err error, what string) bool {
	if how, dead := r.ctrl.died(); dead {
		res.Incomplete = fmt.Sprintf("the controller ended on its own (%s); see its log %s", how, r.ctrl.logPath)
		return true
	}
	if err == nil {
		return false
	}
	res.Incomplete = fmt.Sprintf("%s (controller log: %s)", what, r.ctrl.logPath)
	return true
}

// quiesce lets the controller finish its cleanups, so that their writes count too: it waits
// until the audit log of its writes has not grown for quietFor, at most quietLimit.
func (r *run) quiesce(ctx context.Context) {
	var size int64 = -1
	since := time.Now()
	_ = poll(ctx, quietLimit, 100*time.Millisecond, func() bool {
		st, err := os.Stat(r.auditPath)
		if err != nil {
			return false
		}
		if st.Size() != size {
			size, since = st.Size(), time.Now()
		}
		return time.Since(since) >= quietFor
	})
}

// createTask creates a user TaskRun and records it, among the measured tasks or not.
func (r *run) createTask(ctx context.Context, tr *pipelinev1.TaskRun, measured bool) error {
	at := time.Now()
	if err := r.c.Create(ctx, tr); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if measured {
		r.created[tr.Name] = at
	}
	r.owners.addTask(tr.Name, string(tr.UID))
	return nil
}

// report fills in what the run measured.
func (r *run) report(ctx context.Context, res *Result, from, start time.Time) error {
	usage := r.ctrl.usage()
	res.PeakRSSMiB, res.CPUSeconds, res.ControllerKills = usage.peakRSSMiB, usage.cpuSeconds, r.ctrl.killCount()
	res.PeakRSSAnonMiB, res.PeakRSSFileMiB = usage.peakAnonMiB, usage.peakFileMiB
	var err error
	if res.UserWarnings, err = warningsOn(ctx, r.c, userNamespace); err != nil {
		return err
	}
	if r.sc.vms() {
		res.VMResult, err = settleVMs(ctx, r.c, r.cloud, r.sc, r.chk, func() map[string]time.Time {
			r.mu.Lock()
			defer r.mu.Unlock()
			return maps.Clone(r.secretAt)
		})
		if err != nil {
			return err
		}
	}
	res.HandOver, res.Violations = r.chk.result()
	if lost := r.chk.lostWatch(); lost != "" && res.Incomplete == "" {
		res.Incomplete = "the over-commit check stopped following the TaskRuns, so its count misses what came after: " + lost
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	overSSH := r.answers.provisions.Load()
	if r.sc.vms() && r.sim.Provisions() == 0 {
		// The VMs are real hosts the harness does not listen to: with no provision TaskRun
		// seen, the controller made the build users over SSH itself.
		overSSH = int64(len(r.secretAt))
	}
	res.Provisioner = provisionerSeen(overSSH, r.sim.Provisions())
	var first time.Time
	for _, at := range []map[string]time.Time{r.secretAt, r.errorAt} {
		for _, t := range at {
			if first.IsZero() || t.Before(first) {
				first = t
			}
		}
	}
	if !first.IsZero() {
		res.FirstSecretSeconds = first.Sub(r.ctrl.startedAt).Seconds()
	}

	res.Timeline = Timeline{Start: start}
	waited := map[string]bool{}
	everWaited := r.chk.waitedTasks()
	var latencies []time.Duration
	var lastSecret, lastCreated time.Time
	for task, created := range r.created {
		lastCreated = maxTime(lastCreated, created)
		t := TaskTimes{Created: created, Secret: r.secretAt[task], Done: r.doneAt[task]}
		if e, ok := r.errorAt[task]; ok {
			t.Secret, t.Error = e, true
			res.ErrorSecrets++
		} else if !t.Secret.IsZero() {
			res.Served++
			latencies = append(latencies, t.Secret.Sub(created))
			lastSecret = maxTime(lastSecret, t.Secret)
		}
		if !t.Done.IsZero() {
			waited[task] = everWaited[task]
			res.MakespanSeconds = max(res.MakespanSeconds, t.Done.Sub(start).Seconds())
		}
		res.Timeline.Tasks = append(res.Timeline.Tasks, t)
	}
	res.SecretLatency = percentiles(latencies)
	if lastCreated.After(start) {
		res.CreationSeconds = lastCreated.Sub(start).Seconds()
	}
	if d := lastSecret.Sub(start).Seconds(); d > 0 {
		res.AllocationsPerSec = float64(res.Served) / d
	}
	res.SlotUtilisation = res.Timeline.slotUtilisation(r.sc.slots())

	if from.IsZero() {
		// The measured part never began: writes were made, but to none of its tasks.
		return nil
	}
	tally := newWriteTally(r.owners, from, waited)
	reads := map[string]int{}
	if r.tekton != nil {
		res.Tekton = "real " + r.tekton.Version()
	}
	if err := controlplane.ReadAuditLog(r.auditPath, func(ev *auditv1.Event) {
		switch ev.User.Username {
		case controllerUser:
			if slices.Contains(readVerbs, ev.Verb) {
				if !ev.RequestReceivedTimestamp.Time.Before(from) {
					reads[kindOf(ev)]++
				}
				return
			}
			tally.add(ev)
		case tektonUser:
			if !ev.RequestReceivedTimestamp.Time.Before(from) {
				res.TektonWrites++
			}
			if ev.ObjectRef != nil && ev.ObjectRef.Namespace == unrelatedNamespace {
				res.TektonHistoryWrites++
			}
		}
	}); err != nil {
		return fmt.Errorf("reading the controller's writes from the audit log: %w", err)
	}
	if res.Served > 0 {
		res.WritesPerAllocation = float64(tally.total) / float64(res.Served)
	}
	res.WritesPerTaskNoWait, res.WritesPerTaskWaited, res.TasksWaited = tally.perTaskAverages()
	res.WritesOutsideTasks, res.WritesByKind, res.EventsWritten = tally.outside, tally.kinds(), tally.events
	res.ServerWriteTime = percentiles(tally.serverTimes)
	res.ReadsByKind = reads
	if res.Served > 0 && len(res.MeasuredCPUSeconds) > 0 {
		var sum float64
		for _, s := range res.MeasuredCPUSeconds {
			sum += s
		}
		res.CPUMsPerTask = sum * 1000 / float64(res.Served)
	}
	if res.Incomplete == "" && res.Served == 0 {
		res.Incomplete = fmt.Sprintf("the controller served no task (controller log: %s)", r.ctrl.logPath)
	}
	return nil
}

// provisionerSeen names how the controller reached the hosts, from what the simulation saw:
// SSH sessions on the simulated hosts, or provision TaskRuns.
func provisionerSeen(overSSH, byTaskRun int64) string {
	switch {
	case overSSH > 0 && byTaskRun > 0:
		return "ssh+taskrun"
	case overSSH > 0:
		return "ssh"
	case byTaskRun > 0:
		return "taskrun"
	}
	return "none"
}

// setUp writes the scenario's config, host admin secret (also the VMs' admin key) and the VM
// cloud's API key. Both the upstream controller and berth read this config: hosts are named by
// bare IPs, their admin secret's name names the architecture and the secret carries the
// multi-platform-secret label, concurrency is at most 8.
func (r *run) setUp(ctx context.Context, hosts *sshfake.Fleet, cloudKey string) error {
	for _, ns := range []string{controllerNamespace, userNamespace} {
		if err := r.cp.EnsureNamespace(ctx, ns); err != nil {
			return err
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: adminSecret, Namespace: controllerNamespace,
		Labels: map[string]string{contract.SecretLabel: "true"}},
		Data: map[string][]byte{"id_rsa": hosts.AdminKeyPEM}}
	data := hostConfig(hosts, r.sc.Concurrency)
	objects := []client.Object{secret}
	if r.cloud != nil {
		addVMPlatform(data, r.sc, r.cloud.URL())
		objects = append(objects, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cloudSecret, Namespace: controllerNamespace},
			Data: map[string][]byte{"api-key": []byte(cloudKey)}})
	}
	for _, f := range r.o.Install {
		objs, err := controlplane.ReadObjects(f)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			namespaced, err := r.c.IsObjectNamespaced(obj)
			if err != nil {
				return fmt.Errorf("%s: %s %s: %w", f, obj.GetKind(), obj.GetName(), err)
			}
			if namespaced {
				obj.SetNamespace(controllerNamespace)
			}
			objects = append(objects, obj)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: controllerNamespace,
		Labels: map[string]string{contract.ConfigLabel: "hosts"}}, Data: data}
	for _, o := range append(objects, cm) {
		if err := r.c.Create(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

// createUnrelated makes the scenario's TaskRuns of no concern to the controller. In the
// simulation they are never started. Real Tekton would run such TaskRuns (at its pace, hours
// for idle-cluster's), so with it they are what an idle cluster holds: history, finished before
// Tekton starts, which Tekton then leaves alone.
func (r *run) createUnrelated(ctx context.Context) error {
	if r.sc.Unrelated == 0 {
		return nil
	}
	if err := r.cp.EnsureNamespace(ctx, unrelatedNamespace); err != nil {
		return err
	}
	began := time.Now()
	var made atomic.Int64
	err := parallel(r.sc.Unrelated, 32, func(i int) error {
		tr := unrelatedTask(i)
		if r.o.RealTekton {
			// As Tekton's webhook would have defaulted it when it was created.
			tr.SetDefaults(ctx)
		}
		if err := r.c.Create(ctx, tr); err != nil {
			return err
		}
		if r.o.RealTekton {
			finished(tr)
			if err := r.c.Status().Update(ctx, tr); err != nil {
				return fmt.Errorf("finishing unrelated TaskRun %s: %w", tr.Name, err)
			}
		}
		if n := made.Add(1); n%20000 == 0 && int(n) < r.sc.Unrelated {
			fmt.Fprintf(r.o.Log, "  %d of %d unrelated TaskRuns created\n", n, r.sc.Unrelated)
		}
		return nil
	})
	fmt.Fprintf(r.o.Log, "  %d unrelated TaskRuns created in %s\n", made.Load(), time.Since(began).Round(time.Second))
	return err
}

// hostConfig is the config of the simulated hosts: host.s390x-NNN.* of linux/s390x.
func hostConfig(hosts *sshfake.Fleet, concurrency int) map[string]string {
	data := map[string]string{}
	for i, h := range hosts.Servers {
		p := fmt.Sprintf("host.s390x-%03d.", i)
		data[p+"address"] = configAddress(h.Address)
		data[p+"host-key"] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.HostKey)))
		data[p+"user"] = "root"
		data[p+"platform"] = benchPlatform
		data[p+"secret"] = adminSecret
		data[p+"concurrency"] = strconv.Itoa(concurrency)
	}
	return data
}

// unrelatedTask is the i-th TaskRun of no concern to the controller.
func unrelatedTask(i int) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("unrelated-%06d", i), Namespace: unrelatedNamespace},
		Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "lint", Image: "golang", Script: "go vet ./..."}}}}}
}

// finished gives tr, as created, the status Tekton leaves on a TaskRun whose one step succeeded:
// its spec resolved, the step's container terminated with 0, Succeeded=True, started when it was
// created and done now. It names no pod: Tekton (v1.15.1) looks up the pod of every finished
// TaskRun it reconciles, to stop its sidecars, and writes a Warning Event for each whose pod is
// gone, as the history's pods are; without a pod name its reconciler returns early and writes
// nothing.
func finished(tr *pipelinev1.TaskRun) {
	started, ended := tr.CreationTimestamp, metav1.Now()
	tr.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue,
		Reason: pipelinev1.TaskRunReasonSuccessful.String(), Message: "All Steps have completed executing",
		LastTransitionTime: apis.VolatileTime{Inner: ended}})
	tr.Status.ObservedGeneration = tr.Generation
	tr.Status.StartTime, tr.Status.CompletionTime = &started, &ended
	tr.Status.TaskSpec = tr.Spec.TaskSpec
	for _, step := range tr.Spec.TaskSpec.Steps {
		tr.Status.Steps = append(tr.Status.Steps, pipelinev1.StepState{Name: step.Name, Container: "step-" + step.Name,
			ContainerState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: started, FinishedAt: ended}}})
	}
}

// userTask is a user TaskRun of the run: with real Tekton, its pod's run drawn now, which
// kwok waits out once its secret is there (the simulation draws it when the secret appears).
func (r *run) userTask(name string) *pipelinev1.TaskRun {
	tr := userTask(name)
	if r.tekton != nil {
		tr.Annotations = map[string]string{realtekton.RunForAnnotation: r.sim.Duration().String()}
	}
	return tr
}

// userTask is a user TaskRun as buildah-remote makes it.
func userTask(name string) *pipelinev1.TaskRun {
	return &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: userNamespace},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(benchPlatform)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: "true",
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh"}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name}}}},
			},
		},
	}
}

// warningsOn counts the Warning events of a namespace by reason.
func warningsOn(ctx context.Context, c client.Client, namespace string) (map[string]int, error) {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning {
			out[e.Reason] += max(1, int(e.Count))
		}
	}
	return out, nil
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	return poll(ctx, limit, 20*time.Millisecond, cond)
}

// poll calls cond every interval until it holds, for at most limit.
func poll(ctx context.Context, limit, every time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
	return nil
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(n, workers int, f func(int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
