package hostconfig

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

const ns = "berth-system"

var (
	cp    *controlplane.ControlPlane
	store = NewStore()
)

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunTests(m, &cp, func(ctx context.Context) error {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			return err
		}
		mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
			Scheme:                 controlplane.Scheme(),
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
			Cache:                  cache.Options{ByObject: CacheByObject(ns)},
		})
		if err != nil {
			return err
		}
		w := &Watcher{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: ns, Store: store,
			Recorder: mgr.GetEventRecorder("berth")}
		if err := w.SetupWithManager(mgr); err != nil {
			return err
		}
		go func() {
			if err := mgr.Start(ctx); err != nil {
				panic(err)
			}
		}()
		return nil
	}))
}

func hostData(hosts ...string) map[string]string {
	d := map[string]string{}
	for _, h := range hosts {
		d["host."+h+".address"] = "198.18.1.2"
		d["host."+h+".user"] = "root"
		d["host."+h+".platform"] = "linux/s390x"
		d["host."+h+".secret"] = "s390x-admin"
		d["host."+h+".concurrency"] = "2"
	}
	return d
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("never: %s", what)
	}
}

// eventWith finds an Event on the ConfigMap with the reason whose note contains text.
func eventWith(t *testing.T, cm, reason, text string) bool {
	t.Helper()
	var list eventsv1.EventList
	if err := cp.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Regarding.Name == cm && e.Reason == reason && strings.Contains(e.Note, text) {
			return true
		}
	}
	return false
}

// armData is a dynamic platform with every setting it needs.
func armData(d map[string]string) map[string]string {
	d["dynamic-platforms"] = "linux/arm64"
	for k, v := range map[string]string{"type": "aws", "max-instances": "10", "ssh-secret": "s390x-admin", "region": "us-east-1",
		"ami": "ami-1", "instance-type": "m6g.large", "key-name": "k", "aws-secret": "s390x-admin"} {
		d["dynamic.linux-arm64."+k] = v
	}
	return d
}

// TestEditsAreJudgedPerPlatform is the hot reload: an edit's good parts take effect, what it
// breaks keeps its last good settings with a Warning Event naming the key, a platform it adds
// broken is unusable alone, and only an edit that breaks the whole file is rejected whole.
func TestEditsAreJudgedPerPlatform(t *testing.T) {
	ctx := context.Background()
	// The secret exists, so only the config itself is judged here.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s390x-admin", Namespace: ns}, Data: map[string][]byte{"id_rsa": []byte("key")}}
	if err := cp.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Client.Delete(ctx, secret); err != nil {
			t.Error(err)
		}
	})
	cm := watchedConfigMap(t)
	setData(t, cm, armData(hostData("s390x-1", "s390x-2")))
	eventually(t, "the valid config is in force", func() bool {
		cfg := store.Config()
		return cfg != nil && len(cfg.HostsFor("linux/s390x")) == 2 && cfg.Usable("linux/arm64")
	})
	// The metrics are set just after the config is put in force.
	eventually(t, "berth_config_valid is 1", func() bool { return testutil.ToFloat64(configValid) == 1 })
	if v := testutil.ToFloat64(configValid); v != 1 {
		t.Fatalf("berth_config_valid = %v after a valid config, want 1", v)
	}

	// One edit: a good change, a broken host, a typo that breaks a platform, a platform added bare.
	cm.Data["host.s390x-2.concurrency"] = "3"
	cm.Data["host.s390x-1.concurrency"] = "0"
	cm.Data["dynamic.linux-arm64.max-instances"] = "20"
	cm.Data["dynamic.linux-arm64.ssh-secrte"] = cm.Data["dynamic.linux-arm64.ssh-secret"]
	delete(cm.Data, "dynamic.linux-arm64.ssh-secret")
	cm.Data["dynamic-platforms"] = "linux/arm64,linux/riscv64"
	if err := cp.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Warning Events name each broken key", func() bool {
		return eventWith(t, cm.Name, ReasonKeptLastGood, "platform linux/arm64 keeps its last good settings: error: dynamic.linux-arm64.ssh-secret: missing; it is required (ssh-secrte is set: did you mean ssh-secret?)") &&
			eventWith(t, cm.Name, ReasonKeptLastGood, "host s390x-1 keeps its last good settings: error: host.s390x-1.concurrency: 0 is out of range") &&
			eventWith(t, cm.Name, ReasonPlatformUnusable, "1 platform(s) cannot be served and their tasks fail (linux/riscv64): error: dynamic.linux-riscv64.type")
	})
	cfg := store.Config()
	if h := cfg.Host("s390x-2"); h == nil || h.Concurrency != 3 {
		t.Errorf("s390x-2 must take the edit (concurrency 3): %+v", h)
	}
	if h := cfg.Host("s390x-1"); h == nil || h.Concurrency != 2 {
		t.Errorf("s390x-1 must keep its last good concurrency 2: %+v", h)
	}
	if d := cfg.Dynamic["linux/arm64"]; !cfg.Usable("linux/arm64") || d == nil || d.MaxInstances != 10 {
		t.Errorf("linux/arm64 must keep its last good settings (10 VMs, not the edit's 20): %+v", d)
	}
	if cfg.Usable("linux/riscv64") || len(cfg.Broken("linux/riscv64")) != 1 {
		t.Errorf("linux/riscv64, added bare, must be unusable and say why: %v", cfg.Broken("linux/riscv64"))
	}
	// The metrics are set just after the config is put in force.
	eventually(t, "berth_config_valid is 0", func() bool { return testutil.ToFloat64(configValid) == 0 })
	if v := testutil.ToFloat64(configValid); v != 0 {
		t.Errorf("berth_config_valid = %v with broken parts, want 0", v)
	}
	if v := testutil.ToFloat64(platformUsable.WithLabelValues("linux/riscv64")); v != 0 {
		t.Errorf("berth_platform_usable{linux/riscv64} = %v, want 0", v)
	}
	if v := testutil.ToFloat64(platformUsable.WithLabelValues("linux/s390x")); v != 1 {
		t.Errorf("berth_platform_usable{linux/s390x} = %v, want 1", v)
	}

	// A restarted controller finds the broken edit in the ConfigMap and falls back on the
	// stored config in force, exactly as the running one did.
	restarted := restartedWatcher(t)
	if cfg := restarted.Store.Config(); cfg == nil || cfg.Dynamic["linux/arm64"] == nil || cfg.Dynamic["linux/arm64"].MaxInstances != 10 ||
		cfg.Host("s390x-1") == nil || cfg.Host("s390x-1").Concurrency != 2 || cfg.Host("s390x-2").Concurrency != 3 || cfg.Usable("linux/riscv64") {
		t.Fatalf("after a restart the last good settings are lost: %+v", cfg)
	}

	// An edit that leaves no platform at all is rejected whole; everything stays.
	inForce := store.Config()
	broken := cm.DeepCopy()
	broken.Data = map[string]string{"allowed-namespaces": "builds"}
	if err := cp.Client.Update(ctx, broken); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the empty edit is rejected", func() bool {
		return eventWith(t, cm.Name, ReasonRejected, "rejected as a whole; the last good config stays in force")
	})
	if store.Config() != inForce {
		t.Fatal("an edit that names no platform replaced the config in force")
	}
	if _, problems := store.Rejected(); len(problems.Errors()) != 1 {
		t.Fatalf("Rejected() problems = %s, want the one fatal error", problems.Summary())
	}
	if cfg := restartedWatcher(t).Store.Config(); cfg == nil || !cfg.Usable("linux/arm64") || len(cfg.HostsFor("linux/s390x")) != 2 {
		t.Fatalf("a controller restarted on a wholly broken ConfigMap must keep serving what was in force: %+v", cfg)
	}

	// The fix removes s390x-2 and raises s390x-1.
	cm = broken
	cm.Data = armData(hostData("s390x-1"))
	cm.Data["host.s390x-1.concurrency"] = "3"
	if err := cp.Client.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fixed config is in force", func() bool {
		cfg := store.Config()
		return cfg != nil && cfg.Host("s390x-1").Concurrency == 3
	})
	// The metrics are set just after the config is put in force.
	eventually(t, "berth_config_valid is 1", func() bool { return testutil.ToFloat64(configValid) == 1 })
	if v := testutil.ToFloat64(configValid); v != 1 {
		t.Fatalf("berth_config_valid = %v after the fix, want 1", v)
	}
	if store.Config().Host("s390x-2") != nil || len(store.Config().HostsFor("linux/s390x")) != 1 {
		t.Fatal("the removed host still takes new work")
	}
	if h := store.Host("s390x-2"); h == nil || h.Address != "198.18.1.2" {
		t.Fatal("the removed host can no longer be found for cleaning up its running tasks")
	}
	if _, problems := store.Rejected(); problems != nil {
		t.Fatalf("a rejected config is still reported after the fix: %s", problems.Summary())
	}
}

// restartedWatcher judges the ConfigMap as a freshly started controller would: an empty store.
func restartedWatcher(t *testing.T) *Watcher {
	t.Helper()
	w := &Watcher{Client: cp.Client, APIReader: cp.Client, Namespace: ns, Store: NewStore(), Recorder: events.NewFakeRecorder(100)}
	if _, err := w.Reconcile(context.Background(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	return w
}

func TestMissingSecretIsReported(t *testing.T) {
	cm := watchedConfigMap(t)
	data := armData(hostData("s390x-1", "s390x-2"))
	data["host.s390x-1.secret"] = "no-such-secret"
	setData(t, cm, data)
	eventually(t, "a SecretMissing Event names the key and the secret", func() bool {
		return eventWith(t, cm.Name, ReasonSecretMissing, "host.s390x-1.secret: secret berth-system/no-such-secret does not exist")
	})
}
