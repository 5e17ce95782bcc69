package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/status"
)

// statusEnv is berth's namespace holding a config and records as the controller writes them:
// two static s390x hosts (one quarantined), a dynamic arm64 platform with a booting VM, a
// local platform; two tasks running and three waiting on s390x.
type statusEnv struct {
	namespace, kubeconfig string
	now                   time.Time
}

func newStatusEnv(t *testing.T, namespace string) *statusEnv {
	t.Helper()
	ctx := context.Background()
	env := &statusEnv{namespace: namespace, kubeconfig: filepath.Join(t.TempDir(), "kubeconfig"), now: time.Now()}
	if err := os.WriteFile(env.kubeconfig, cp.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cp.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: namespace, Labels: map[string]string{hostconfig.ConfigLabel: "hosts"}},
		Data: map[string]string{
			"local-platforms":      "linux/amd64",
			"dynamic-platforms":    "linux/arm64",
			"host.s390x-1.address": "198.18.1.2", "host.s390x-1.user": "root", "host.s390x-1.platform": "linux/s390x",
			"host.s390x-1.secret": "admin", "host.s390x-1.concurrency": "1",
			"host.s390x-2.address": "198.18.2.2", "host.s390x-2.user": "root", "host.s390x-2.platform": "linux/s390x",
			"host.s390x-2.secret": "admin", "host.s390x-2.concurrency": "2",
			"dynamic.linux-arm64.type": "aws", "dynamic.linux-arm64.region": "us-east-1", "dynamic.linux-arm64.ami": "ami-0123456789abcdef0",
			"dynamic.linux-arm64.instance-type": "m6g.large", "dynamic.linux-arm64.key-name": "k", "dynamic.linux-arm64.aws-secret": "aws",
			"dynamic.linux-arm64.ssh-secret": "ssh", "dynamic.linux-arm64.max-instances": "3",
		},
	}
	quarantined := &berthv1.BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "s390x-2", Namespace: namespace}, Spec: berthv1.BuildHostSpec{HostName: "s390x-2"},
		Status: berthv1.BuildHostStatus{Platform: "linux/s390x", Quarantined: true, QuarantineReason: "less than 10Gi free at /home"}}
	vm := &berthv1.BuildHost{ObjectMeta: metav1.ObjectMeta{Name: "arm64-vm-1", Namespace: namespace},
		Spec:   berthv1.BuildHostSpec{Instance: &berthv1.InstanceSpec{Platform: "linux/arm64", Provider: "aws", Slots: 1, AdminUser: "ec2-user", AdminSecret: "ssh"}},
		Status: berthv1.BuildHostStatus{Instance: &berthv1.InstanceStatus{Phase: berthv1.InstanceBooting, ID: "i-0abc"}}}
	statuses := []berthv1.BuildHostStatus{quarantined.Status, vm.Status}
	for _, o := range []client.Object{cm, quarantined, vm} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// A create writes no status of a BuildHost: berth writes it apart, as here.
	for i, bh := range []*berthv1.BuildHost{quarantined, vm} {
		bh.Status = statuses[i]
		if err := cp.Client.Status().Update(ctx, bh); err != nil {
			t.Fatal(err)
		}
	}
	// team-b got the last slot, so team-a's turn comes first.
	env.record(t, "team-a", "running-a", berthv1.PhaseReady, "s390x-1", 6*time.Minute, 5*time.Minute)
	env.record(t, "team-b", "running-b", berthv1.PhaseReady, "s390x-2", 2*time.Minute, time.Minute)
	env.record(t, "team-a", "wait-a1", berthv1.PhaseWaiting, "", 90*time.Second, 0)
	env.record(t, "team-b", "wait-b1", berthv1.PhaseWaiting, "", 60*time.Second, 0)
	env.record(t, "team-a", "wait-a2", berthv1.PhaseWaiting, "", 30*time.Second, 0)
	return env
}

// record writes an Allocation queued `queued` ago, ready `ready` ago (if it holds host).
func (e *statusEnv) record(t *testing.T, ns, name string, phase berthv1.Phase, host string, queued, ready time.Duration) {
	t.Helper()
	uid := types.UID(fmt.Sprintf("%s-%s-uid", ns, name))
	rec := &berthv1.Allocation{
		ObjectMeta: metav1.ObjectMeta{Name: string(uid), Namespace: e.namespace},
		Spec: berthv1.AllocationSpec{TaskRun: berthv1.TaskRunRef{Namespace: ns, Name: name, UID: uid}, Platform: "linux/s390x",
			Strategy: "static", Queued: metav1.NewTime(e.now.Add(-queued))},
		Status: berthv1.AllocationStatus{Phase: phase},
	}
	if host != "" {
		rec.Status.Login = &berthv1.HostLogin{Host: host, Address: "198.18.1.2", AdminUser: "root", AdminSecret: "admin", Platform: "linux/s390x"}
		rec.Status.BuildUser = "u-" + name
		reserved, readyAt := berthv1.NewMicroTime(e.now.Add(-queued)), berthv1.NewMicroTime(e.now.Add(-ready))
		rec.Status.ReservedAt, rec.Status.ReadyAt = &reserved, &readyAt
	}
	if err := cp.Client.Create(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

func (e *statusEnv) args(more ...string) []string {
	return append([]string{"status", "--kubeconfig", e.kubeconfig, "-n", e.namespace}, more...)
}

func TestStatusTables(t *testing.T) {
	env := newStatusEnv(t, "status-tables")
	out, err := berth(t, env.args()...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("\n%s", out)
	// Ready 5 and 1 minutes ago: one hand-over every 4 minutes.
	for _, row := range []string{
		`linux/amd64 +local +cluster +- +- +- +- +- +-`,
		`linux/arm64 +dynamic +3 instances +0 +1 +0 +0 +- +unknown`,
		`linux/s390x +static +3 slots +2 +0 +2 +3 +9\ds +4m`,
		`arm64-vm-1 +linux/arm64 +vm +Booting +0/1 +ok +\d+s +-`,
		`s390x-1 +linux/s390x +static +- +1/1 +ok +- +-`,
		`s390x-2 +linux/s390x +static +- +1/2 +quarantined +\d+s +less than 10Gi free at /home`,
		`team-a/wait-a1 +linux/s390x +1 +9\ds +4m`,
		`team-b/wait-b1 +linux/s390x +2 +6\ds +8m`,
		`team-a/wait-a2 +linux/s390x +3 +3\ds +12m`,
	} {
		if !regexp.MustCompile(`(?m)^` + row + ` *$`).MatchString(out) {
			t.Errorf("no row %q", row)
		}
	}
}

// -o json and -o yaml print the documented shape, field for field.
func TestStatusJSONAndYAML(t *testing.T) {
	env := newStatusEnv(t, "status-json")
	for _, format := range []string{"json", "yaml"} {
		out, err := berth(t, env.args("-o", format)...)
		if err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, out)
		}
		data := []byte(out)
		if format == "yaml" {
			if data, err = yaml.YAMLToJSON(data); err != nil {
				t.Fatal(err)
			}
		}
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		var r status.Report
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("-o %s does not parse into the documented shape: %v\n%s", format, err, out)
		}
		if r.Namespace != env.namespace || len(r.Platforms) != 3 {
			t.Fatalf("-o %s: namespace %q, %d platforms\n%s", format, r.Namespace, len(r.Platforms), out)
		}
		s390x := r.Platforms[2]
		if s390x.Platform != "linux/s390x" || s390x.Capacity != 3 || s390x.CapacityUnit != "slots" || s390x.Used != 2 ||
			s390x.Queued != 3 || s390x.HandOverSeconds == nil || *s390x.HandOverSeconds != 240 || len(s390x.Hosts) != 2 {
			t.Fatalf("-o %s: s390x %+v", format, s390x)
		}
		var queue []string
		for _, w := range s390x.Waiting {
			queue = append(queue, fmt.Sprintf("%s/%s@%d eta %v", w.Namespace, w.Name, w.Position, *w.ETASeconds))
		}
		if got := strings.Join(queue, ", "); got != "team-a/wait-a1@1 eta 240, team-b/wait-b1@2 eta 480, team-a/wait-a2@3 eta 720" {
			t.Fatalf("-o %s: queue %s", format, got)
		}
		if arm := r.Platforms[1]; arm.Strategy != "dynamic" || arm.CapacityUnit != "instances" || arm.Booting != 1 || arm.Hosts[0].State != "Booting" {
			t.Fatalf("-o %s: arm64 %+v", format, arm)
		}
	}
}

// --watch prints again when a record changes, without waiting for its interval; into a pipe
// it prints one report after the other.
func TestStatusWatchPrintsOnChange(t *testing.T) {
	env := newStatusEnv(t, "status-watch")
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	cmd := NewRootCommand()
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SetArgs(env.args("--watch", "--interval", "1h"))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("--watch ended with %v", err)
		}
	}()
	waitFor(t, out, "team-a/wait-a2")
	env.record(t, "team-c", "newcomer", berthv1.PhaseWaiting, "", 0, 0)
	waitFor(t, out, "team-c/newcomer")
	if n := strings.Count(out.String(), "PLATFORM "); n < 2 {
		t.Fatalf("%d reports printed, want one after the other\n%s", n, out)
	}
}

func waitFor(t *testing.T, out fmt.Stringer, text string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("never printed %q:\n%s", text, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Linked as kubectl-berth, this test binary is berth as kubectl runs it (see
// TestKubectlBerthStatus): it does what cmd/berth's main does.
func init() {
	if filepath.Base(os.Args[0]) == KubectlPlugin {
		if err := NewRootCommand().Execute(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// `kubectl berth status` runs berth, linked as kubectl-berth on PATH, as kubectl runs any
// plugin.
func TestKubectlBerthStatus(t *testing.T) {
	env := newStatusEnv(t, "status-kubectl")
	binDir, err := controlplane.BinaryDir()
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pathDir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(pathDir, KubectlPlugin)); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		kubectl := exec.Command(filepath.Join(binDir, "kubectl"), args...)
		kubectl.Env = append(os.Environ(), "PATH="+pathDir+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := kubectl.Output()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := run("berth", "status", "--kubeconfig", env.kubeconfig, "-n", env.namespace, "-o", "json")
	var r status.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Namespace != env.namespace || len(r.Platforms) != 3 {
		t.Fatalf("kubectl berth status -o json: %v\n%s", err, out)
	}
	if help := run("berth", "status", "--help"); !strings.Contains(help, "kubectl berth status [flags]") {
		t.Fatalf("the help does not say how kubectl runs it:\n%s", help)
	}
}

func TestStatusOutsideBerthsNamespaceSaysSo(t *testing.T) {
	if err := cp.EnsureNamespace(context.Background(), "status-empty"); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := berth(t, "status", "--kubeconfig", kubeconfig, "-n", "status-empty")
	if err == nil || !strings.Contains(err.Error(), "is this berth's namespace") {
		t.Fatalf("want an error naming the namespace, got %v\n%s", err, out)
	}
}

// A task that never held a slot waits without a record: berth status finds it by berth's
// waiting label on its TaskRun, once, and leaves out a labelled TaskRun that has ended.
func TestStatusShowsTasksWaitingWithoutARecord(t *testing.T) {
	env := newStatusEnv(t, "status-unrecorded")
	ctx := context.Background()
	const ns = "team-d"
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	taskRun := func(name string) *pipelinev1.TaskRun {
		tr := &pipelinev1.TaskRun{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
				contract.WaitingForPlatformLabel: contract.PlatformLabelValue("linux/s390x")}},
			Spec: pipelinev1.TaskRunSpec{
				Params:   pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues("linux/s390x")}},
				TaskSpec: &pipelinev1.TaskSpec{Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: "true"}}},
			},
		}
		if err := cp.Client.Create(ctx, tr); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	taskRun("queued-d")
	ended := taskRun("ended-d")
	ended.Status.SetCondition(&apis.Condition{Type: apis.ConditionSucceeded, Status: corev1.ConditionTrue})
	if err := cp.Client.Status().Update(ctx, ended); err != nil {
		t.Fatal(err)
	}
	out, err := berth(t, env.args("-o", "json")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var r status.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	s390x := r.Platforms[2]
	var queue []string
	for _, w := range s390x.Waiting {
		queue = append(queue, w.Namespace+"/"+w.Name)
	}
	if s390x.Queued != 4 || !slices.Contains(queue, ns+"/queued-d") || slices.Contains(queue, ns+"/ended-d") {
		t.Fatalf("queued %d: %v; want the three recorded waiters and %s/queued-d", s390x.Queued, queue, ns)
	}
}
