package taskrun_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/devstack"
	"github.com/berth-ci/berth/internal/testground/sshhosts"
)

// The package's tests share one stack: a real control plane with berth's RBAC and Tasks, three
// real sshd hosts, the Tekton stand-in executing the provision/clean/update TaskRuns with
// berth's own `berth host` code, and berth's controller running as its ServiceAccount.
var stack *devstack.Stack

const (
	platform      = "linux/s390x"
	runScriptKey  = "berth.test/run-script"
	stackHosts    = 3
	hostTimeout   = "--dial-timeout=3s"
	eventuallyFor = 90 * time.Second
)

func TestMain(m *testing.M) {
	if err := sshhosts.Prerequisites(); err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping the controller tests:", err)
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "berth-controller-test-")
	if err != nil {
		panic(err)
	}
	// BERTH_TEST_LOG=<file> keeps the controller's log of a run, to read after a failure.
	if path := os.Getenv("BERTH_TEST_LOG"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			panic(err)
		}
		defer f.Close()
		ctrl.SetLogger(zap.New(zap.WriteTo(f), zap.UseDevMode(true)))
	}
	os.Exit(runWithStack(m, dir))
}

// runWithStack returns instead of exiting, so the state directory is removed in every case.
func runWithStack(m *testing.M, dir string) int {
	defer os.RemoveAll(dir)
	var err error
	stack, err = devstack.Up(context.Background(), devstack.Options{
		StateDir: dir,
		Hosts:    stackHosts,
		HostStep: func(ctx context.Context, args []string) error {
			cmd := cli.NewRootCommand()
			cmd.SetArgs(append(args, hostTimeout))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			return cmd.ExecuteContext(ctx)
		},
		RunScripts: func(tr *pipelinev1.TaskRun) bool { return tr.Labels[runScriptKey] == "true" },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: bringing up the stack:", err)
		return 1
	}
	code := 1
	if err := startController(controllerOptions()); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting the controller:", err)
	} else {
		code = m.Run()
	}
	if err := stack.Down(); err != nil {
		fmt.Fprintln(os.Stderr, "tearing the stack down:", err)
	}
	return code
}

func controllerOptions() controller.Options {
	o := controller.DefaultOptions()
	o.MetricsAddress, o.HealthProbeAddress = "0", "0"
	o.HostCheckInterval = 0
	o.FailedTaskRetention = 0
	o.WaitTimeout = 0
	return o
}

func startController(o controller.Options) error { return stack.StartController(o) }

// restartController replaces the running controller, as a crash and restart would.
func restartController(t *testing.T, o controller.Options) {
	t.Helper()
	if err := stack.StopController(); err != nil {
		t.Fatalf("stopping the controller: %v", err)
	}
	if err := startController(o); err != nil {
		t.Fatalf("starting the controller: %v", err)
	}
}

func c() client.Client { return stack.ControlPlane.Client }

func applyConfig(t *testing.T, concurrency int, extra map[string]string) {
	t.Helper()
	data := stack.StaticHostConfig(platform, concurrency, "linux/amd64")
	for k, v := range extra {
		data[k] = v
	}
	rv, err := stack.ApplyHostConfig(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "config "+rv+" is in force", func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(context.Background(), &events, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "ConfigApplied" && strings.Contains(e.Note, "resourceVersion "+rv+":") {
				return true, nil
			}
		}
		return false, nil
	})
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	if err := stack.ControlPlane.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// userTaskRun is a TaskRun as buildah-remote makes them: PLATFORM and the secret volume.
func userTaskRun(ns, name, platformParam, script string) *pipelinev1.TaskRun {
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{}},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platformParam)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Results: []pipelinev1.TaskResult{{Name: "out"}},
				Steps: []pipelinev1.Step{{Name: "build", Image: "buildah", Script: script,
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name, Optional: ptr(false)}}}},
			},
		},
	}
	if script != "" {
		tr.Labels[runScriptKey] = "true"
	}
	return tr
}

func ptr[T any](v T) *T { return &v }

func create(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	if err := c().Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, eventuallyFor, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		t.Fatalf("never: %s (last error: %v)", what, last)
	}
}

func secretOf(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	eventually(t, "the secret of "+tr.Name+" exists", func() (bool, error) {
		err := c().Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}, &s)
		return err == nil, client.IgnoreNotFound(err)
	})
	return &s
}

func get(t *testing.T, tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	t.Helper()
	var got pipelinev1.TaskRun
	if err := c().Get(context.Background(), client.ObjectKeyFromObject(tr), &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// settled waits until berth has nothing left to do for the namespace: no finalizers or
// assigned hosts on its TaskRuns, no secrets, no records, and no internal TaskRuns for them.
func settled(t *testing.T, ns string) {
	t.Helper()
	eventually(t, "everything of "+ns+" is cleaned up", func() (bool, error) {
		var trs pipelinev1.TaskRunList
		if err := c().List(context.Background(), &trs, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, tr := range trs.Items {
			if len(tr.Finalizers) > 0 || tr.Labels[contract.AssignedHostLabel] != "" && tr.Labels[contract.AssignedHostLabel] != contract.Localhost {
				return false, fmt.Errorf("%s still has finalizers %v / host %q", tr.Name, tr.Finalizers, tr.Labels[contract.AssignedHostLabel])
			}
		}
		var secrets corev1.SecretList
		if err := c().List(context.Background(), &secrets, client.InNamespace(ns), client.HasLabels{contract.SecretLabel}); err != nil {
			return false, err
		}
		if len(secrets.Items) > 0 {
			return false, fmt.Errorf("%d secrets left", len(secrets.Items))
		}
		var records berthv1.AllocationList
		if err := c().List(context.Background(), &records, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, rec := range records.Items {
			if rec.Spec.TaskRun.Namespace == ns {
				return false, fmt.Errorf("record %s of %s is left: phase %s, debts %+v, message %q",
					rec.Name, rec.Spec.TaskRun.Key(), rec.Status.Phase, rec.Status.Debts, rec.Status.Message)
			}
		}
		var internal pipelinev1.TaskRunList
		if err := c().List(context.Background(), &internal, client.InNamespace(devstack.Namespace),
			client.MatchingLabels{contract.UserTaskNamespaceLabel: ns}); err != nil {
			return false, err
		}
		if len(internal.Items) > 0 {
			it := internal.Items[0]
			return false, fmt.Errorf("%d internal TaskRuns left, e.g. %s labels=%v spec.status=%q conditions=%+v",
				len(internal.Items), it.Name, it.Labels, it.Spec.Status, it.Status.Conditions)
		}
		return true, nil
	})
}

// noBuildUsersLeft asserts that no host has a berth build user any more.
func noBuildUsersLeft(t *testing.T) {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		out, err := h.Run(context.Background(), "getent passwd | cut -d: -f1 | grep '^u-' || true")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != "" {
			t.Errorf("host %s still has build users: %s", h.Name, strings.Fields(out))
		}
	}
}
