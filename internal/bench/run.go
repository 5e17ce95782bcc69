package bench

import (
	"bytes"
	"context"
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

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/testground/controlplane"
	"github.com/berth-ci/berth/internal/testground/sshfake"
	"github.com/berth-ci/berth/internal/testground/vmcloud"
)

// Scenario is a workload.
type Scenario struct {
	Name        string
	Hosts       int // static hosts of linux/s390x
	Concurrency int // tasks at once per host (per VM on a VM platform)
	Tasks       int // user TaskRuns, created in one burst
	Unrelated   int // TaskRuns of no concern to the controller, present before it starts
	MinRun      time.Duration
	MaxRun      time.Duration
	// MaxInstances > 0 makes linux/s390x a dynamic platform with that max-instances, served
	// from a local VM cloud in the bench process: a VM per task, or with Pooled a
	// dynamic-pool platform whose VMs take Concurrency tasks each.
	MaxInstances int
	Pooled       bool
	// Chaos is how many times the controller is killed (SIGKILL) during the run, at random
	// moments, and started again at once.
	Chaos int
}

// vms tells whether the scenario's platform is served by VMs.
func (sc Scenario) vms() bool { return sc.MaxInstances > 0 }

// slots is how many tasks the platform runs at once.
func (sc Scenario) slots() int {
	if sc.vms() {
		return sc.MaxInstances * sc.Concurrency
	}
	return sc.Hosts * sc.Concurrency
}

// ScenarioNamed returns a scenario, its counts multiplied by scale.
func ScenarioNamed(name string, scale float64) (Scenario, error) {
	var s Scenario
	switch name {
	case "static":
		s = Scenario{Name: name, Hosts: 50, Concurrency: 4, Tasks: 2000, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "idle-cluster":
		s = Scenario{Name: name, Hosts: 10, Concurrency: 2, Tasks: 100, Unrelated: 20000, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "dynamic":
		// Every task waits for a VM of its own to boot (a real sshd host, about 1.5 s).
		s = Scenario{Name: name, MaxInstances: 20, Concurrency: 1, Tasks: 200, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "dynamic-pool":
		s = Scenario{Name: name, MaxInstances: 12, Pooled: true, Concurrency: 4, Tasks: 2000, MinRun: time.Second, MaxRun: 3 * time.Second}
	default:
		return s, fmt.Errorf("unknown scenario %q: static, idle-cluster, dynamic or dynamic-pool", name)
	}
	scaled := func(n int) int { return max(1, int(float64(n)*scale+0.5)) }
	s.Hosts, s.Tasks = scaled(s.Hosts), scaled(s.Tasks)
	if s.vms() {
		s.Hosts = 0
		// Two VMs at least, so that tasks are spread and hand-overs happen.
		s.MaxInstances = max(2, scaled(s.MaxInstances))
	}
	if s.Unrelated > 0 {
		s.Unrelated = scaled(s.Unrelated)
	}
	return s, nil
}

// Result is what one run measured.
type Result struct {
	Controller          string      `json:"controller"`
	Scenario            string      `json:"scenario"`
	Tasks               int         `json:"tasks"`
	Served              int         `json:"served"`
	SecretLatency       Percentiles `json:"creationToSecretMs"`
	HandOver            Percentiles `json:"slotFreedToNextAllocationMs"`
	MakespanSeconds     float64     `json:"makespanSeconds"`
	AllocationsPerSec   float64     `json:"allocationsPerSecond"`
	WritesPerAllocation float64     `json:"apiWritesPerAllocation"`
	// Provisioner is how the controller reached the hosts: ssh (from its own process) or
	// taskrun (provision TaskRuns the simulation completed).
	Provisioner string  `json:"provisioner"`
	PeakRSSMiB  float64 `json:"controllerPeakRssMiB"`
	CPUSeconds  float64 `json:"controllerCpuSeconds"`
	Violations  int     `json:"overcommitViolations"`
	// ControllerKills is how many times chaos killed the controller during the run.
	ControllerKills int `json:"controllerKills"`
	// UserWarnings counts the Warning events on user TaskRuns by reason. Nothing in a run
	// deserves one (no tenant edits anything, every host works): any is worth a look.
	UserWarnings map[string]int `json:"userTaskWarnings"`
	// VMResult is set on a VM platform; its fields are at the top level of the JSON.
	*VMResult
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

const (
	controllerNamespace = "berth-system"
	userNamespace       = "bench"
	benchPlatform       = "linux/s390x"
	adminSecret         = "host-admin-key"
)

// Run measures one controller on one scenario, on a control plane of its own.
func Run(ctx context.Context, sc Scenario, controllerCmd string, log io.Writer) (_ *Result, retErr error) {
	dir, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		return nil, err
	}
	// The controller's log stays when the run fails: the error points to it.
	defer func() {
		if retErr == nil {
			os.RemoveAll(dir)
		}
	}()
	cp, err := controlplane.Start()
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	// The harness must never be what throttles the run: no client-side rate limit for it.
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		return nil, err
	}
	var harnessWrites atomic.Int64
	var answers hostAnswers
	// On a VM platform the fleet has no hosts: only its admin key, which the VMs accept.
	hosts, err := sshfake.StartFleet(sc.Hosts, answers.answer)
	if err != nil {
		return nil, err
	}
	defer hosts.Close()
	var cloud *vmcloud.Cloud
	var cloudKey string
	if sc.vms() {
		var stopCloud func() error
		cloud, cloudKey, stopCloud, err = startCloud(hosts.AdminKey, filepath.Join(dir, "vmcloud.log"))
		if err != nil {
			return nil, err
		}
		// Deferred before the controller starts, so it stops after the controller.
		defer stopCloud()
	}
	if err := setUp(ctx, cp, c, sc, hosts, cloud, cloudKey, &harnessWrites, log); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeConfig, 0o600); err != nil {
		return nil, err
	}

	// The simulation and the checker watch from before the controller starts.
	simCtx, stopSim := context.WithCancel(ctx)
	defer stopSim()
	var (
		mu        sync.Mutex
		createdAt = map[string]time.Time{}
		secretAt  = map[string]time.Time{}
		doneAt    = map[string]time.Time{}
	)
	sim := &Tekton{Client: c, Namespace: userNamespace, Duration: Uniform(sc.MinRun, sc.MaxRun),
		OnSecret: func(task string, at time.Time) { mu.Lock(); secretAt[task] = at; mu.Unlock() },
		OnDone:   func(task string, at time.Time) { mu.Lock(); doneAt[task] = at; mu.Unlock() },
	}
	go func() { _ = sim.Run(simCtx, cfg) }()
	chk, err := watchHosts(simCtx, cfg, c, sc.Concurrency, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(createdAt) - len(secretAt)
	})
	if err != nil {
		return nil, err
	}

	ctrl, err := startController(controllerCmd, kubeconfig, filepath.Join(dir, "controller.log"))
	if err != nil {
		return nil, err
	}
	defer ctrl.stop()

	// Warm-up: one task served means the controller has synced its caches and read its config.
	warm := userTask("warm-up")
	if err := c.Create(ctx, warm); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 2*time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return !doneAt["warm-up"].IsZero() }); err != nil {
		return nil, fmt.Errorf("the controller served no warm-up task in 2 minutes (see its log %s): %w", ctrl.logPath, err)
	}
	writesBefore, err := apiWrites(ctx, cp)
	if err != nil {
		return nil, err
	}
	simBefore, harnessBefore := sim.Writes(), harnessWrites.Load()

	if sc.vms() {
		kind := "dynamic"
		if sc.Pooled {
			kind = "dynamic-pool"
		}
		fmt.Fprintf(log, "%s: %d tasks on a %s platform of at most %d VMs x %d\n", sc.Name, sc.Tasks, kind, sc.MaxInstances, sc.Concurrency)
	} else {
		fmt.Fprintf(log, "%s: %d tasks on %d hosts x %d\n", sc.Name, sc.Tasks, sc.Hosts, sc.Concurrency)
	}
	chaosCtx, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	chaosDone := make(chan error, 1)
	go func() {
		points := chaosPoints(sc.Chaos, sc.Tasks, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
		chaosDone <- runChaos(chaosCtx, ctrl, points, func() int { mu.Lock(); defer mu.Unlock(); return len(secretAt) - 1 }, log)
	}()
	start := time.Now()
	err = parallel(sc.Tasks, 8, func(i int) error {
		tr := userTask(fmt.Sprintf("task-%05d", i))
		at := time.Now()
		harnessWrites.Add(1)
		if err := c.Create(ctx, tr); err != nil {
			return err
		}
		mu.Lock()
		createdAt[tr.Name] = at
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Each task holds a slot for its run; on a dynamic platform also for its VM's boot, its
	// build user's removal and the VM's end. Every restart costs a resync.
	perTask := sc.MaxRun
	if sc.vms() && !sc.Pooled {
		perTask += 10 * time.Second
	}
	timeout := 5*time.Minute + time.Duration(sc.Tasks)*perTask/time.Duration(max(1, sc.slots()))*2 + time.Duration(sc.Chaos)*30*time.Second
	waitErr := waitFor(ctx, timeout, func() bool {
		if _, dead := ctrl.died(); dead {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		return len(doneAt) >= sc.Tasks+1
	})
	stopChaos()
	chaosErr := <-chaosDone
	if how, dead := ctrl.died(); dead {
		return nil, fmt.Errorf("the controller ended on its own (%s); see its log %s", how, ctrl.logPath)
	}
	// Let the controller finish its cleanups, so their writes count too.
	time.Sleep(2 * time.Second)
	usage := ctrl.usage()
	writesAfter, err := apiWrites(ctx, cp)
	if err != nil {
		return nil, err
	}
	warnings, err := warningsOn(ctx, c, userNamespace)
	if err != nil {
		return nil, err
	}
	var vmResult *VMResult
	if sc.vms() {
		vmResult, err = settleVMs(ctx, c, cloud, sc, chk, func() map[string]time.Time {
			mu.Lock()
			defer mu.Unlock()
			return maps.Clone(secretAt)
		})
		if err != nil {
			return nil, err
		}
	}

	mu.Lock()
	defer mu.Unlock()
	overSSH := answers.provisions.Load()
	if sc.vms() && sim.Provisions() == 0 {
		// The VMs are real hosts the harness does not listen to: with no provision TaskRun
		// seen, the controller made the build users over SSH itself.
		overSSH = int64(len(secretAt))
	}
	res := &Result{Controller: controllerCmd, Scenario: sc.Name, Tasks: sc.Tasks, PeakRSSMiB: usage.peakRSSMiB, CPUSeconds: usage.cpuSeconds,
		Provisioner: provisionerSeen(overSSH, sim.Provisions()), ControllerKills: ctrl.killCount(), UserWarnings: warnings, VMResult: vmResult}
	var latencies []time.Duration
	var lastSecret, lastDone time.Time
	for task, created := range createdAt {
		s, ok := secretAt[task]
		if !ok {
			continue
		}
		res.Served++
		latencies = append(latencies, s.Sub(created))
		lastSecret = maxTime(lastSecret, s)
		lastDone = maxTime(lastDone, doneAt[task])
	}
	res.SecretLatency = percentiles(latencies)
	res.HandOver, res.Violations = chk.result()
	res.MakespanSeconds = lastDone.Sub(start).Seconds()
	if d := lastSecret.Sub(start).Seconds(); d > 0 {
		res.AllocationsPerSec = float64(res.Served) / d
	}
	others := (sim.Writes() - simBefore) + (harnessWrites.Load() - harnessBefore)
	if res.Served > 0 {
		res.WritesPerAllocation = float64(writesAfter-writesBefore-others) / float64(res.Served)
	}
	if chaosErr != nil {
		return res, fmt.Errorf("restarting the killed controller: %w (controller log: %s)", chaosErr, ctrl.logPath)
	}
	if waitErr != nil {
		return res, fmt.Errorf("%d of %d tasks finished in %s (controller log: %s)", len(doneAt)-1, sc.Tasks, timeout, ctrl.logPath)
	}
	if res.Served == 0 {
		return res, fmt.Errorf("the controller served no task (controller log: %s)", ctrl.logPath)
	}
	return res, nil
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

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// setUp writes the scenario's config, host admin secret (also the VMs' admin key), the VM
// cloud's API key and unrelated TaskRuns.
func setUp(ctx context.Context, cp *controlplane.ControlPlane, c client.Client, sc Scenario, hosts *sshfake.Fleet, cloud *vmcloud.Cloud, cloudKey string, writes *atomic.Int64, log io.Writer) error {
	for _, ns := range []string{controllerNamespace, userNamespace, "unrelated"} {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			return err
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: adminSecret, Namespace: controllerNamespace},
		Data: map[string][]byte{"id_rsa": hosts.AdminKeyPEM}}
	data := map[string]string{}
	for i, h := range hosts.Servers {
		p := fmt.Sprintf("host.bench-%03d.", i)
		data[p+"address"] = h.Address
		data[p+"host-key"] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.HostKey)))
		data[p+"user"] = "root"
		data[p+"platform"] = benchPlatform
		data[p+"secret"] = adminSecret
		data[p+"concurrency"] = strconv.Itoa(sc.Concurrency)
	}
	objects := []client.Object{secret}
	if cloud != nil {
		addVMPlatform(data, sc, cloud.URL())
		objects = append(objects, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cloudSecret, Namespace: controllerNamespace},
			Data: map[string][]byte{"api-key": []byte(cloudKey)}})
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: controllerNamespace,
		Labels: map[string]string{contract.ConfigLabel: "hosts"}}, Data: data}
	for _, o := range append(objects, cm) {
		if err := c.Create(ctx, o); err != nil {
			return err
		}
	}
	if sc.Unrelated > 0 {
		fmt.Fprintf(log, "%s: creating %d unrelated TaskRuns\n", sc.Name, sc.Unrelated)
	}
	return parallel(sc.Unrelated, 16, func(i int) error {
		tr := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("unrelated-%05d", i), Namespace: "unrelated"},
			Spec: pipelinev1.TaskRunSpec{TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "lint", Image: "golang", Script: "go vet ./..."}}}}}
		writes.Add(1)
		return c.Create(ctx, tr)
	})
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

// apiWrites is the apiserver's own count of mutating requests so far.
func apiWrites(ctx context.Context, cp *controlplane.ControlPlane) (int64, error) {
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return 0, err
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading the apiserver's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return 0, err
	}
	var total float64
	for _, m := range families["apiserver_request_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "verb" && slices.Contains([]string{"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"}, l.GetValue()) {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return int64(total), nil
}

// hostChecker sees, from a watch, how many tasks hold each host and how long a freed slot
// stays empty while tasks wait.
type hostChecker struct {
	mu         sync.Mutex
	capacity   int
	hostOf     map[string]string
	count      map[string]int
	freed      map[string][]time.Time
	handOvers  []time.Duration
	violations int
	// tasksOn lists the tasks each host was ever assigned, in order, each once.
	tasksOn map[string][]string
}

func watchHosts(ctx context.Context, cfg *rest.Config, c client.Client, capacity int, waiting func() int) (*hostChecker, error) {
	informers, err := cache.New(cfg, cache.Options{Scheme: c.Scheme(), DefaultNamespaces: map[string]cache.Config{userNamespace: {}}})
	if err != nil {
		return nil, err
	}
	inf, err := informers.GetInformer(ctx, &pipelinev1.TaskRun{})
	if err != nil {
		return nil, err
	}
	h := newHostChecker(capacity)
	seen := func(obj any) {
		if tr, ok := obj.(*pipelinev1.TaskRun); ok {
			h.observe(tr.Name, tr.Labels[contract.AssignedHostLabel], waiting())
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if tr, ok := obj.(*pipelinev1.TaskRun); ok {
				h.observe(tr.Name, "", waiting())
			}
		},
	})
	if err != nil {
		return nil, err
	}
	go func() { _ = informers.Start(ctx) }()
	if !informers.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the checker's informer did not sync")
	}
	return h, nil
}

func newHostChecker(capacity int) *hostChecker {
	return &hostChecker{capacity: capacity, hostOf: map[string]string{}, count: map[string]int{}, freed: map[string][]time.Time{}, tasksOn: map[string][]string{}}
}

func (h *hostChecker) observe(task, host string, waiting int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	prev := h.hostOf[task]
	if prev == host {
		return
	}
	now := time.Now()
	if prev != "" {
		h.count[prev]--
		if waiting > 0 {
			h.freed[prev] = append(h.freed[prev], now)
		}
	}
	h.hostOf[task] = host
	if host != "" {
		h.count[host]++
		if !slices.Contains(h.tasksOn[host], task) {
			h.tasksOn[host] = append(h.tasksOn[host], task)
		}
		if h.count[host] > h.capacity {
			h.violations++
		}
		if q := h.freed[host]; len(q) > 0 {
			h.handOvers = append(h.handOvers, now.Sub(q[0]))
			h.freed[host] = q[1:]
		}
	}
}

// assignments is a copy of the tasks each host was assigned.
func (h *hostChecker) assignments() map[string][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string][]string, len(h.tasksOn))
	for host, tasks := range h.tasksOn {
		out[host] = slices.Clone(tasks)
	}
	return out
}

func (h *hostChecker) result() (Percentiles, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return percentiles(append([]time.Duration(nil), h.handOvers...)), h.violations
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
