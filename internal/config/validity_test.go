package config

import (
	"strings"
	"testing"
)

// Each case breaks one thing; only what it touches may suffer. usable lists every platform of
// base() that must still be served.
func TestAMistakeHarmsOnlyWhatItTouches(t *testing.T) {
	all := []Platform{"linux/x86_64", "local", "linux/s390x", "linux/arm64", "linux/ppc64le"}
	for _, tc := range []struct {
		name     string
		data     map[string]string
		broken   Platform // "" when every platform stays usable
		leftOut  string   // a host that must be left out
		contains string   // in the first problem of broken (or of leftOut)
	}{
		{"dynamic required key dropped", with(nil, "dynamic.linux-arm64.ssh-secret"), "linux/arm64", "", "ssh-secret: missing"},
		{"dynamic required key typed wrong", with(map[string]string{"dynamic.linux-arm64.ssh-secrte": "aws-ssh"}, "dynamic.linux-arm64.ssh-secret"),
			"linux/arm64", "", "ssh-secrte is set: did you mean ssh-secret?"},
		{"dynamic bad number", with(map[string]string{"dynamic.linux-arm64.max-instances": "10x"}), "linux/arm64", "", "not a whole number"},
		{"pool bad number", with(map[string]string{"dynamic.linux-ppc64le.max-age": "two hours"}), "linux/ppc64le", "", "not a whole number"},
		{"dynamic unsafe sudo", with(map[string]string{"dynamic.linux-arm64.sudo-commands": "/usr/bin/podman *"}), "linux/arm64", "", "sudo-commands"},
		{"one host bad address", with(map[string]string{"host.s390x-1.address": "10.0.0.1;reboot"}), "", "s390x-1", "neither an IP address"},
		{"one host bad number", with(map[string]string{"host.s390x-2.concurrency": "2x"}), "", "s390x-2", "not a whole number"},
		{"every host of a platform bad", with(map[string]string{"host.s390x-1.concurrency": "x", "host.s390x-2.address": "a b"}), "linux/s390x", "s390x-1", "host s390x-1 is left out"},
		{"unknown optional key", with(map[string]string{"dynamic.linux-arm64.regoin": "x"}), "", "", ""},
		{"pool key on a plain dynamic platform", with(map[string]string{"dynamic.linux-arm64.concurrency": "4", "dynamic.linux-arm64.max-age": "60"}), "", "", ""},
		{"bad namespace pattern", with(map[string]string{"allowed-namespaces": "team-(a"}), "", "", ""},
		{"bad namespace cap", with(map[string]string{"max-tasks-per-namespace": "0"}), "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, problems := Parse(tc.data)
			if len(cfg.Fatal()) != 0 {
				t.Fatalf("a mistake in one place made the whole config unusable: %s", cfg.Fatal().Summary())
			}
			for _, p := range all {
				if p == tc.broken {
					b := cfg.Broken(p)
					if cfg.Usable(p) || len(b) == 0 || !strings.Contains(b[0].String(), tc.contains) {
						t.Errorf("%s: usable %v, broken by %v; want unusable with a problem containing %q", p, cfg.Usable(p), b, tc.contains)
					}
					continue
				}
				if !cfg.Usable(p) {
					t.Errorf("%s suffers from a mistake elsewhere: %s", p, cfg.Broken(p).Summary())
				}
			}
			if tc.leftOut != "" {
				if cfg.Host(tc.leftOut) != nil {
					t.Errorf("host %s is in the pool despite its error", tc.leftOut)
				}
				found := false
				for _, p := range problems.Errors() {
					found = found || strings.HasPrefix(p.Key, "host."+tc.leftOut+".") && strings.Contains(p.String(), tc.contains)
				}
				if !found {
					t.Errorf("no error about host %s containing %q: %s", tc.leftOut, tc.contains, problems.Summary())
				}
			}
			for _, h := range []string{"s390x-1", "s390x-2"} {
				if h != tc.leftOut && tc.broken != "linux/s390x" && cfg.Host(h) == nil {
					t.Errorf("host %s was left out by a mistake elsewhere", h)
				}
			}
		})
	}
}

func TestABadNamespacePatternNeverOpensTheList(t *testing.T) {
	cfg, problems := Parse(with(map[string]string{"allowed-namespaces": "team-(a,.*["}))
	if problems.HasErrors() {
		t.Fatalf("allowed-namespaces must never be an error: %s", problems.Summary())
	}
	for ns, want := range map[string]bool{"team-(a": true, ".*[": true, "team-a": false, "anything": false} {
		if got := cfg.NamespaceAllowed(ns); got != want {
			t.Errorf("NamespaceAllowed(%q) = %v, want %v", ns, got, want)
		}
	}
}

func TestMergeKeepsLastGoodPerPlatformAndHost(t *testing.T) {
	prev, problems := Parse(with(map[string]string{"max-tasks-per-namespace": "5", "user-key-type": "ecdsa-p256"}))
	if problems.HasErrors() {
		t.Fatal(problems.Summary())
	}
	next, _ := Parse(with(map[string]string{
		"dynamic.linux-arm64.max-instances":   "ten",          // breaks linux/arm64
		"dynamic.linux-ppc64le.max-instances": "7",            // a good edit
		"host.s390x-1.concurrency":            "lots",         // breaks one host
		"host.s390x-2.concurrency":            "3",            // a good edit
		"max-tasks-per-namespace":             "-1",           // a bad global
		"user-key-type":                       "rsa",          // another
		"local-platforms":                     "linux/x86_64", // "local" removed on purpose
	}))
	cfg, kept := Merge(prev, next)

	if d := cfg.Dynamic["linux/arm64"]; !cfg.Usable("linux/arm64") || d == nil || d.MaxInstances != 10 {
		t.Errorf("linux/arm64 must keep its last good settings (10 VMs): usable %v, %+v", cfg.Usable("linux/arm64"), d)
	}
	if d := cfg.Dynamic["linux/ppc64le"]; d == nil || d.MaxInstances != 7 {
		t.Errorf("linux/ppc64le must take the edit (7 VMs): %+v", d)
	}
	if h := cfg.Host("s390x-1"); h == nil || h.Concurrency != 4 {
		t.Errorf("s390x-1 must keep its last good settings (4): %+v", h)
	}
	if h := cfg.Host("s390x-2"); h == nil || h.Concurrency != 3 {
		t.Errorf("s390x-2 must take the edit (3): %+v", h)
	}
	if cfg.MaxTasksPerNamespace != 5 || cfg.UserKeyType != KeyTypeECDSAP256 {
		t.Errorf("max-tasks-per-namespace = %d, user-key-type %s; want the last good 5 and ecdsa-p256", cfg.MaxTasksPerNamespace, cfg.UserKeyType)
	}
	if _, ok := cfg.Strategy("local"); ok {
		t.Error("a platform the edit removed must be gone")
	}
	var what []string
	for _, k := range kept {
		what = append(what, k.What()+"="+k.Problems[0].Key)
	}
	want := "platform linux/arm64=dynamic.linux-arm64.max-instances host s390x-1=host.s390x-1.concurrency max-tasks-per-namespace=max-tasks-per-namespace user-key-type=user-key-type"
	if got := strings.Join(what, " "); got != want {
		t.Errorf("kept\n got %s\nwant %s", got, want)
	}
	for _, r := range cfg.Report() {
		if wantKept := r.Platform == "linux/arm64" || r.Platform == "linux/s390x"; r.KeptLastGood != wantKept || !r.Usable {
			t.Errorf("report %s: kept %v usable %v", r.Platform, r.KeptLastGood, r.Usable)
		}
	}
	// The inputs are left alone, and a second broken edit still keeps the first good settings.
	if next.Usable("linux/arm64") || prev.Dynamic["linux/ppc64le"].MaxInstances != 3 {
		t.Error("Merge changed its inputs")
	}
	again, _ := Merge(cfg, next)
	if d := again.Dynamic["linux/arm64"]; d == nil || d.MaxInstances != 10 {
		t.Errorf("after a second broken edit linux/arm64 = %+v, want the first good settings", d)
	}
}

func TestMergeOnAFirstStartServesWhatIsGood(t *testing.T) {
	next, _ := Parse(with(nil, "dynamic.linux-arm64.ami"))
	cfg, kept := Merge(nil, next)
	if len(kept) != 0 || cfg.Usable("linux/arm64") || !cfg.Usable("linux/s390x") {
		t.Fatalf("first start: kept %v, arm64 usable %v, s390x usable %v", kept, cfg.Usable("linux/arm64"), cfg.Usable("linux/s390x"))
	}
}

func TestReport(t *testing.T) {
	cfg, _ := Parse(with(map[string]string{"dynamic.linux-arm64.regoin": "x"}, "dynamic.linux-ppc64le.key"))
	got := map[Platform]PlatformReport{}
	for _, r := range cfg.Report() {
		got[r.Platform] = r
	}
	for p, want := range map[Platform]struct {
		strategy Strategy
		capacity int
		usable   bool
		problem  string
	}{
		"linux/s390x":   {StrategyStatic, 6, true, ""},
		"linux/arm64":   {StrategyDynamic, 10, true, "dynamic.linux-arm64.regoin"},
		"linux/ppc64le": {StrategyDynamicPool, 0, false, "dynamic.linux-ppc64le.key"},
		"local":         {StrategyLocal, 0, true, ""},
	} {
		r := got[p]
		first := ""
		if len(r.Problems) > 0 {
			first = r.Problems[0].Key
		}
		if r.Strategy != want.strategy || r.Capacity != want.capacity || r.Usable != want.usable || first != want.problem {
			t.Errorf("%s: %+v, want %+v", p, r, want)
		}
	}
}

// TestSnapshotRoundTrip: what the controller stores brings back every usable platform's
// settings and nothing broken, and serves as Merge's prev after a restart.
func TestSnapshotRoundTrip(t *testing.T) {
	cfg, _ := Parse(with(map[string]string{"max-tasks-per-namespace": "4", "user-key-type": "rsa-3072"}, "dynamic.linux-ppc64le.key"))
	data, err := cfg.Snapshot().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := back.Strategy("linux/ppc64le"); ok {
		t.Error("a broken platform was stored as if it were good")
	}
	for _, p := range cfg.UsablePlatforms() {
		if !back.Usable(p) {
			t.Errorf("%s lost in the snapshot", p)
		}
	}
	if h := back.Host("s390x-2"); h == nil || h.Address != "s390x-2.builders.example.com:2222" || h.Concurrency != 2 {
		t.Errorf("host s390x-2 back as %+v", h)
	}
	if d := back.Dynamic["linux/arm64"]; d == nil || d.Settings["ami"] != "ami-0123" || d.AllocationTimeout != cfg.Dynamic["linux/arm64"].AllocationTimeout {
		t.Errorf("linux/arm64 back as %+v", d)
	}
	if back.MaxTasksPerNamespace != 4 || back.UserKeyType != KeyTypeRSA3072 {
		t.Errorf("globals back as %d, %s", back.MaxTasksPerNamespace, back.UserKeyType)
	}
	again, _ := back.Snapshot().Marshal()
	if string(again) != string(data) {
		t.Error("a snapshot of a restored snapshot differs: the controller would rewrite it on every start")
	}
	next, _ := Parse(with(map[string]string{"dynamic.linux-arm64.max-instances": "many"}))
	merged, kept := Merge(back, next)
	if d := merged.Dynamic["linux/arm64"]; len(kept) != 1 || d == nil || d.MaxInstances != 10 {
		t.Errorf("after a restart a broken edit must still fall back to the stored settings: kept %v, %+v", kept, d)
	}
	if _, err := UnmarshalSnapshot([]byte(`{"platforms":{"linux/arm64":"dynamic"},"hosts":[{"Name":"a","Platform":"linux/arm64"}]}`)); err == nil {
		t.Error("a stored host of a platform not served statically must be refused")
	}
}
