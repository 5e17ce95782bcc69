package controlplane

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

func TestReapOrphansKillsOnlyWhatDeadOwnersLeft(t *testing.T) {
	ledgerDir = t.TempDir()
	t.Cleanup(func() { ledgerDir = filepath.Join(os.TempDir(), "berth-controlplanes") })
	binDir := t.TempDir()
	fakeEtcd := filepath.Join(binDir, "etcd")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fakeEtcd, data, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(fakeEtcd, "300")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	orphan, kept := start(), start()
	dataDir, err := os.MkdirTemp("", "k8s_test_framework_")
	if err != nil {
		t.Fatal(err)
	}

	// An owner that has exited: its pid no longer has the recorded start time.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	write := func(name string, l ledger) {
		b, _ := json.Marshal(l)
		if err := os.WriteFile(filepath.Join(ledgerDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	othersDir, err := os.MkdirTemp("", "k8s_test_framework_")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(othersDir)
	write("dead.json", ledger{Owner: dead.Process.Pid, OwnerStartTime: "1", BinDir: binDir, PIDs: []int{orphan.Process.Pid}, Dirs: []string{dataDir}})
	write("alive.json", ledger{Owner: os.Getpid(), OwnerStartTime: startTime(os.Getpid()), BinDir: binDir, PIDs: []int{kept.Process.Pid}})
	// Another checkout's orphan: only a Start from that checkout's binaries can kill it, so this
	// one leaves it, its directory and its ledger alone.
	write("other-checkout.json", ledger{Owner: dead.Process.Pid, OwnerStartTime: "1", BinDir: t.TempDir(), PIDs: []int{kept.Process.Pid}, Dirs: []string{othersDir}})

	if n := ReapOrphans(binDir); n != 1 {
		t.Fatalf("reaped %d processes, want 1", n)
	}
	waited := make(chan error, 1)
	go func() { waited <- orphan.Wait() }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the orphaned process is still running")
	}
	if err := kept.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the process of a live owner was killed: %v", err)
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Fatalf("the orphan's data directory is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ledgerDir, "alive.json")); err != nil {
		t.Fatalf("a live owner's ledger was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ledgerDir, "other-checkout.json")); err != nil {
		t.Fatalf("another checkout's ledger was removed: %v", err)
	}
	if _, err := os.Stat(othersDir); err != nil {
		t.Fatalf("the directory of another checkout's control plane was removed: %v", err)
	}
}

func TestStartRecordsItsOwnControlPlane(t *testing.T) {
	data, err := os.ReadFile(cp.ledger)
	if err != nil {
		t.Fatalf("the running control plane left no ledger: %v", err)
	}
	var l ledger
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	if l.Owner != os.Getpid() || len(l.PIDs) != 3 {
		t.Fatalf("ledger %+v, want owner %d with kube-apiserver, etcd and kube-controller-manager", l, os.Getpid())
	}
	var kcmDir bool
	for _, d := range l.Dirs {
		kcmDir = kcmDir || strings.HasPrefix(filepath.Base(d), controllerManagerDirPrefix)
	}
	if !kcmDir {
		t.Fatalf("ledger %+v does not name kube-controller-manager's directory: a killed owner would leave it behind", l)
	}
}

// A process may run several control planes (the CaaS stand-in boots one per cluster): each
// ledger names only its own processes, so none points at the pids of one stopped before.
func TestEachControlPlaneRecordsOnlyItsOwnProcesses(t *testing.T) {
	crds, err := realdata.CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	second, err := Start(WithoutGarbageCollector(), WithoutDefaultCRDs(), WithCRDs(crds))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = second.Stop()
		}
	}()
	read := func(path string) ledger {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var l ledger
		if err := json.Unmarshal(data, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	first, own := read(cp.ledger), read(second.ledger)
	if len(first.PIDs) != 3 || len(own.PIDs) != 2 {
		t.Fatalf("ledgers list %v and %v, want kube-apiserver, etcd and kube-controller-manager, then kube-apiserver and etcd", first.PIDs, own.PIDs)
	}
	for _, pid := range own.PIDs {
		if slices.Contains(first.PIDs, pid) {
			t.Fatalf("process %d is in both ledgers", pid)
		}
	}

	// The second has the CRDs it was given and none of the default ones.
	ctx := context.Background()
	var ctis unstructured.UnstructuredList
	ctis.SetGroupVersionKind(schema.GroupVersionKind{Group: "clustertemplate.openshift.io", Version: "v1alpha1", Kind: "ClusterTemplateInstanceList"})
	if err := second.Client.List(ctx, &ctis); err != nil {
		t.Errorf("listing ClusterTemplateInstances on a control plane started WithCRDs: %v", err)
	}
	if err := second.Client.List(ctx, &pipelinev1.TaskRunList{}); !meta.IsNoMatchError(err) {
		t.Errorf("listing TaskRuns on a control plane started WithoutDefaultCRDs: %v, want no such kind", err)
	}

	stopped = true
	if err := second.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range own.PIDs {
		if syscall.Kill(pid, 0) == nil && parentPID(pid) == os.Getpid() {
			t.Errorf("process %d of the stopped control plane still runs", pid)
		}
	}
	if _, err := os.Stat(second.ledger); !os.IsNotExist(err) {
		t.Errorf("the stopped control plane's ledger is still there: %v", err)
	}
}
