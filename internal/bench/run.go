package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
)

// Scenario is a workload.
type Scenario struct {
	Name        string
	Hosts       int // static hosts of linux/s390x
	Concurrency int // per host
	Tasks       int // user TaskRuns, created in one burst
	Unrelated   int // TaskRuns of no concern to the controller, present before it starts
	MinRun      time.Duration
	MaxRun      time.Duration
}

// ScenarioNamed returns a scenario, its counts multiplied by scale.
func ScenarioNamed(name string, scale float64) (Scenario, error) {
	var s Scenario
	switch name {
	case "static":
		s = Scenario{Name: name, Hosts: 50, Concurrency: 4, Tasks: 2000, MinRun: time.Second, MaxRun: 3 * time.Second}
	case "idle-cluster":
		s = Scenario{Name: name, Hosts: 10, Concurrency: 2, Tasks: 100, Unrelated: 20000, MinRun: time.Second, MaxRun: 3 * time.Second}
	default:
		return s, fmt.Errorf("unknown scenario %q: static or idle-cluster", name)
	}
	scaled := func(n int) int { return max(1, int(float64(n)*scale+0.5)) }
	s.Hosts, s.Tasks = scaled(s.Hosts), scaled(s.Tasks)
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
	hosts, err := sshfake.StartFleet(sc.Hosts, answers.answer)
	if err != nil {
		return nil, err
	}
	defer hosts.Close()
	if err := setUp(ctx, cp, c, sc, hosts, &harnessWrites, log); err != nil {
		return nil, err
	}
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

	fmt.Fprintf(log, "%s: %d tasks on %d hosts x %d\n", sc.Name, sc.Tasks, sc.Hosts, sc.Concurrency)
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
	timeout := 5*time.Minute + time.Duration(sc.Tasks)*sc.MaxRun/time.Duration(max(1, sc.Hosts*sc.Concurrency))*2
	waitErr := waitFor(ctx, timeout, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(doneAt) >= sc.Tasks+1
	})
	// Let the controller finish its cleanups, so their writes count too.
	time.Sleep(2 * time.Second)
	usage := ctrl.usage()
	writesAfter, err := apiWrites(ctx, cp)
	if err != nil {
		return nil, err
	}

	mu.Lock()
	defer mu.Unlock()
	res := &Result{Controller: controllerCmd, Scenario: sc.Name, Tasks: sc.Tasks, PeakRSSMiB: usage.peakRSSMiB, CPUSeconds: usage.cpuSeconds,
		Provisioner: provisionerSeen(answers.provisions.Load(), sim.Provisions())}
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

// setUp writes the scenario's config, host admin secret and unrelated TaskRuns.
func setUp(ctx context.Context, cp *controlplane.ControlPlane, c client.Client, sc Scenario, hosts *sshfake.Fleet, writes *atomic.Int64, log io.Writer) error {
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
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: controllerNamespace,
		Labels: map[string]string{contract.ConfigLabel: "hosts"}}, Data: data}
	for _, o := range []client.Object{secret, cm} {
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
	h := &hostChecker{capacity: capacity, hostOf: map[string]string{}, count: map[string]int{}, freed: map[string][]time.Time{}}
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
		if h.count[host] > h.capacity {
			h.violations++
		}
		if q := h.freed[host]; len(q) > 0 {
			h.handOvers = append(h.handOvers, now.Sub(q[0]))
			h.freed[host] = q[1:]
		}
	}
}

func (h *hostChecker) result() (Percentiles, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return percentiles(append([]time.Duration(nil), h.handOvers...)), h.violations
}

// controllerProcess is the controller under test.
type controllerProcess struct {
	cmd     *exec.Cmd
	logPath string
}

type usage struct{ peakRSSMiB, cpuSeconds float64 }

// startController runs the command line through sh (exec, so the pid is the controller's) with
// KUBECONFIG and POD_NAMESPACE set.
func startController(command, kubeconfig, logPath string) (*controllerProcess, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("sh", "-c", "exec "+command)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "POD_NAMESPACE="+controllerNamespace)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the controller %q: %w", command, err)
	}
	return &controllerProcess{cmd: cmd, logPath: logPath}, nil
}

// usage reads the controller's peak resident memory and CPU time from /proc.
func (p *controllerProcess) usage() usage {
	var u usage
	pid := strconv.Itoa(p.cmd.Process.Pid)
	if status, err := os.ReadFile("/proc/" + pid + "/status"); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				u.peakRSSMiB = kb / 1024
			}
		}
	}
	if stat, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) > 12 {
			utime, _ := strconv.ParseFloat(f[11], 64)
			stime, _ := strconv.ParseFloat(f[12], 64)
			u.cpuSeconds = (utime + stime) / 100 // USER_HZ
		}
	}
	return u
}

func (p *controllerProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
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
