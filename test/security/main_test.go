// Package security_test attacks berth as a tenant would: a ServiceAccount that may read and
// write TaskRuns and Secrets in its own namespace and nothing else, acting through an
// impersonating client against a real apiserver, with berth's controller running under its
// shipped RBAC and real sshd hosts behind it. Each test asserts what a host owner would check
// afterwards: no file outside a build user's home changed, no admin key in any tenant secret,
// never more tasks on a host than its concurrency, every build user gone after its task.
package security_test

import (
	"context"
	"os"
	"sort"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

var stack *devstack.Stack

const (
	platform  = "linux/s390x"
	hostCount = 3
)

func TestMain(m *testing.M) {
	code := stacktest.MainWith(m, &stack, hostCount, controllerOptions(), auditKeys) // auditKeys: keyserver_flood_test.go
	os.RemoveAll(metricsTLS.certDir)
	os.Exit(code)
}

// controllerOptions are those of the package's in-process controller.
func controllerOptions() controller.Options {
	o := stacktest.Options()
	o.MirrorRevertInterval = 2 * time.Second
	o.MetricsAddress, o.MetricsSecure, o.MetricsCertDir = metricsServing() // metrics_test.go
	return o
}

// admin observes: the test's own eyes, never the attacker's hands.
func admin() client.Client { return stack.ControlPlane.Client }

// tenant is a namespace and the ServiceAccount that owns it (see stacktest.Tenant).
type tenant struct {
	ns string
	c  client.Client
	st *stacktest.Tenant
}

// newTenant makes a namespace whose ServiceAccount may do anything to TaskRuns and Secrets
// there, and nothing anywhere else.
func newTenant(t *testing.T, suffix string) *tenant {
	t.Helper()
	st := stacktest.NewTenant(t, stack, suffix)
	return &tenant{ns: st.Namespace, c: st.Client, st: st}
}

// taskRun is a TaskRun as buildah-remote makes them: PLATFORM and the secret volume.
func (tn *tenant) taskRun(name, platformParam string) *pipelinev1.TaskRun {
	return tn.st.TaskRun(name, platformParam)
}

func (tn *tenant) create(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	return tn.st.Create(t, tr)
}

func get(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	return stacktest.Get(t, admin(), tr)
}

// relabel is the tenant editing its own TaskRun's labels.
func (tn *tenant) relabel(t *testing.T, tr *pipelinev1.TaskRun, edit func(map[string]string)) {
	t.Helper()
	now := get(t, tr)
	patch := client.MergeFrom(now.DeepCopy())
	if now.Labels == nil {
		now.Labels = map[string]string{}
	}
	edit(now.Labels)
	if err := tn.c.Patch(context.Background(), now, patch); err != nil {
		t.Fatalf("the tenant relabelling %s: %v", tr.Name, err)
	}
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.Eventually(t, what, cond)
}

func secretOf(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	return stacktest.SecretOf(t, admin(), tr)
}

func record(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Record(t, admin(), tr)
}

func phaseIs(t *testing.T, tr *pipelinev1.TaskRun, phase berthv1.Phase) *berthv1.Allocation {
	t.Helper()
	return stacktest.PhaseIs(t, admin(), tr, phase)
}

// waiting waits until the task waits for a slot (see stacktest.IsWaiting).
func waiting(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	stacktest.Waiting(t, admin(), tr)
}

// ready waits until the task has its build user (see stacktest.HandedOver).
func ready(t *testing.T, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	return stacktest.Ready(t, admin(), tr)
}

func finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil); err != nil {
		t.Fatal(err)
	}
}

func hostsByName() []*sshhosts.Host {
	hosts := append([]*sshhosts.Host{}, stack.Fleet.Hosts...)
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Name < hosts[j].Name })
	return hosts
}

func hostNamed(t *testing.T, name string) *sshhosts.Host {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		if h.Name == name {
			return h
		}
	}
	t.Fatalf("no host %s", name)
	return nil
}

// applyConfig puts a host config in force: every host serves platform with concurrency slots,
// plus extra keys.
func applyConfig(t *testing.T, concurrency int, extra map[string]string) {
	t.Helper()
	data := stack.StaticHostConfig(platform, concurrency)
	for k, v := range extra {
		data[k] = v
	}
	applyConfigData(t, data)
}

// applyConfigData puts exactly data in force as the host config (or has it judged and
// rejected, keeping the last good one).
func applyConfigData(t *testing.T, data map[string]string) {
	t.Helper()
	stacktest.ApplyConfig(t, stack, data, "ConfigApplied", "ConfigRejected")
}

// settled waits until berth owes nothing for the namespace (see stacktest.Settled).
func settled(t *testing.T, ns string) {
	t.Helper()
	stacktest.Settled(t, admin(), ns)
}

// handedOver tells whether the record's task has its build user (see stacktest.HandedOver).
func handedOver(t *testing.T, rec *berthv1.Allocation) bool {
	t.Helper()
	ok, err := stacktest.HandedOver(context.Background(), admin(), rec)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}
