package config

import (
	"strings"
	"testing"
	"time"
)

// base is a valid config with one platform per strategy; cases change it.
func base() map[string]string {
	return map[string]string{
		"local-platforms":        "linux/x86_64,local,",
		"dynamic-platforms":      "linux/arm64",
		"dynamic-pool-platforms": "linux/ppc64le",
		"allowed-namespaces":     "builds,team-.*",
		"instance-tag":           "berth-prod",

		"host.s390x-1.address":     "198.18.1.2",
		"host.s390x-1.user":        "root",
		"host.s390x-1.platform":    "linux/s390x",
		"host.s390x-1.secret":      "s390x-admin",
		"host.s390x-1.concurrency": "4",
		"host.s390x-2.address":     "s390x-2.builders.example.com:2222",
		"host.s390x-2.user":        "builder",
		"host.s390x-2.platform":    "linux/s390x",
		"host.s390x-2.secret":      "s390x-admin",
		"host.s390x-2.concurrency": "2",

		"dynamic.linux-arm64.type":            "aws",
		"dynamic.linux-arm64.max-instances":   "10",
		"dynamic.linux-arm64.ssh-secret":      "aws-ssh",
		"dynamic.linux-arm64.region":          "us-east-1",
		"dynamic.linux-arm64.ami":             "ami-0123",
		"dynamic.linux-arm64.instance-type":   "m6g.large",
		"dynamic.linux-arm64.key-name":        "builders",
		"dynamic.linux-arm64.aws-secret":      "aws-account",
		"dynamic.linux-arm64.disk":            "200",
		"dynamic.linux-arm64.sudo-commands":   "/usr/bin/podman, /usr/bin/buildah",
		"dynamic.linux-ppc64le.type":          "ibmp",
		"dynamic.linux-ppc64le.max-instances": "3",
		"dynamic.linux-ppc64le.ssh-secret":    "ibm-ssh",
		"dynamic.linux-ppc64le.concurrency":   "4",
		"dynamic.linux-ppc64le.max-age":       "120",
		"dynamic.linux-ppc64le.key":           "builders",
		"dynamic.linux-ppc64le.image":         "rhel-9",
		"dynamic.linux-ppc64le.secret":        "ibm-api",
		"dynamic.linux-ppc64le.url":           "https://us-south.power-iaas.cloud.ibm.com",
		"dynamic.linux-ppc64le.crn":           "crn:v1:bluemix:public:power-iaas:dal10:a/1::",
		"dynamic.linux-ppc64le.network":       "net-1",
		"dynamic.linux-ppc64le.cores":         "0.25",
	}
}

func with(changes map[string]string, deletes ...string) map[string]string {
	d := base()
	for k, v := range changes {
		d[k] = v
	}
	for _, k := range deletes {
		delete(d, k)
	}
	return d
}

func TestValidConfigIsModelled(t *testing.T) {
	cfg, problems := Parse(base())
	if problems.HasErrors() {
		t.Fatalf("the base config has errors: %s", problems.Summary())
	}
	wantStrategies := map[Platform]Strategy{
		"linux/x86_64": StrategyLocal, "local": StrategyLocal, "linux/s390x": StrategyStatic,
		"linux/arm64": StrategyDynamic, "linux/ppc64le": StrategyDynamicPool,
	}
	for p, want := range wantStrategies {
		if got, ok := cfg.Strategy(p); !ok || got != want {
			t.Errorf("strategy of %s = %q, want %q", p, got, want)
		}
	}
	if len(cfg.Platforms) != len(wantStrategies) {
		t.Errorf("platforms %v, want exactly %v", cfg.Platforms, wantStrategies)
	}
	hosts := cfg.HostsFor("linux/s390x")
	if len(hosts) != 2 || hosts[0].Name != "s390x-1" || hosts[0].Concurrency != 4 || hosts[1].Address != "s390x-2.builders.example.com:2222" {
		t.Errorf("hosts %+v", hosts)
	}
	if h := cfg.Host("s390x-2"); h == nil || h.User != "builder" || h.Concurrency != 2 {
		t.Errorf("Host(s390x-2) = %+v", h)
	}
	if cfg.Host("nope") != nil {
		t.Error("Host(nope) found something")
	}
	arm := cfg.Dynamic["linux/arm64"]
	if arm.Type != "aws" || arm.MaxInstances != 10 || arm.AllocationTimeout != 600*time.Second || arm.Pool != nil ||
		arm.Settings["region"] != "us-east-1" || arm.Settings["disk"] != "200" || arm.SSHSecret != "aws-ssh" {
		t.Errorf("linux/arm64 = %+v", arm)
	}
	ppc := cfg.Dynamic["linux/ppc64le"]
	if ppc.Pool == nil || ppc.Pool.Concurrency != 4 || ppc.Pool.MaxAge != 2*time.Hour {
		t.Errorf("linux/ppc64le pool = %+v", ppc.Pool)
	}
	for ns, want := range map[string]bool{"builds": true, "team-a": true, "builds-2": false, "other": false} {
		if got := cfg.NamespaceAllowed(ns); got != want {
			t.Errorf("NamespaceAllowed(%q) = %v, want %v", ns, got, want)
		}
	}
	var names []string
	for _, s := range cfg.Secrets() {
		names = append(names, s.ConfigKey+"="+s.Name+":"+strings.Join(s.Keys, "+"))
	}
	want := "host.s390x-1.secret=s390x-admin:id_rsa host.s390x-2.secret=s390x-admin:id_rsa " +
		"dynamic.linux-arm64.ssh-secret=aws-ssh:id_rsa dynamic.linux-arm64.aws-secret=aws-account:access-key-id+secret-access-key " +
		"dynamic.linux-ppc64le.ssh-secret=ibm-ssh:id_rsa dynamic.linux-ppc64le.secret=ibm-api:api-key"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("Secrets()\n got %s\nwant %s", got, want)
	}
}

func TestAConfigWithoutPlatformsIsUnusableAsAWhole(t *testing.T) {
	for name, data := range map[string]map[string]string{
		"empty":        {},
		"globals only": {"allowed-namespaces": "builds", "instance-tag": "x"},
		"bad lists":    {"dynamic-platforms": "Linux/ARM64"},
	} {
		cfg, _ := Parse(data)
		if name == "bad lists" {
			// a listed platform with a bad name is a platform: unusable, named, not fatal
			if len(cfg.Fatal()) != 0 || cfg.Usable("Linux/ARM64") || len(cfg.Broken("Linux/ARM64")) == 0 {
				t.Errorf("%s: fatal %v, broken %v", name, cfg.Fatal(), cfg.Broken("Linux/ARM64"))
			}
			continue
		}
		if f := cfg.Fatal(); len(f) != 1 || !strings.Contains(f[0].Message, "names no platform") {
			t.Errorf("%s: fatal problems %v, want one saying the config names no platform", name, f)
		}
	}
}

func TestProblemsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		name     string
		data     map[string]string
		severity Severity
		key      string
		contains string
	}{
		// platform names
		{"dynamic platform without arch", with(map[string]string{"dynamic-platforms": "linux"}), Error, "dynamic-platforms", "must be os/arch"},
		{"local platform not os/arch", with(map[string]string{"local-platforms": "test-platform"}), Warning, "local-platforms", "not os/arch"},
		{"local platform with spaces", with(map[string]string{"local-platforms": "test platform"}), Error, "local-platforms", "must be os/arch"},
		{"platform with capitals", with(map[string]string{"dynamic-platforms": "Linux/arm64"}), Error, "dynamic-platforms", `"Linux" is not a valid name part`},
		{"platform with three parts", with(map[string]string{"local-platforms": "linux/arm/v7"}), Error, "local-platforms", "must be os/arch"},
		{"empty entry mid-list", with(map[string]string{"local-platforms": "local,,linux/x86_64"}), Warning, "local-platforms", "empty entry at position 2"},
		{"host platform invalid", with(map[string]string{"host.s390x-1.platform": "s390x"}), Error, "host.s390x-1.platform", "must be os/arch"},
		// one strategy per platform
		{"local and dynamic", with(map[string]string{"local-platforms": "linux/arm64"}), Error, "dynamic-platforms", "linux/arm64 is also in local-platforms"},
		{"dynamic and pool", with(map[string]string{"dynamic-pool-platforms": "linux/ppc64le,linux/arm64"}), Error, "dynamic-pool-platforms", "linux/arm64 is also in dynamic-platforms"},
		{"static host of a dynamic platform", with(map[string]string{"host.s390x-1.platform": "linux/arm64"}), Error, "host.s390x-1.platform", "linux/arm64 is in dynamic-platforms"},
		{"listed twice", with(map[string]string{"local-platforms": "local,local"}), Warning, "local-platforms", "listed twice"},
		// static hosts
		{"host without address", with(nil, "host.s390x-1.address"), Error, "host.s390x-1.address", "missing; it is required"},
		{"host without platform", with(nil, "host.s390x-1.platform"), Error, "host.s390x-1.platform", "missing; it is required"},
		{"host without secret", with(nil, "host.s390x-1.secret"), Error, "host.s390x-1.secret", "missing; it is required"},
		{"host without user", with(nil, "host.s390x-1.user"), Error, "host.s390x-1.user", "missing; it is required"},
		{"host with empty secret", with(map[string]string{"host.s390x-1.secret": " "}), Error, "host.s390x-1.secret", "is empty"},
		{"host address garbage", with(map[string]string{"host.s390x-1.address": "not an address!"}), Error, "host.s390x-1.address", "neither an IP address nor a DNS name"},
		{"host address bad port", with(map[string]string{"host.s390x-1.address": "10.0.0.1:99999"}), Error, "host.s390x-1.address", "invalid port"},
		{"concurrency zero", with(map[string]string{"host.s390x-1.concurrency": "0"}), Error, "host.s390x-1.concurrency", "0 is out of range"},
		{"concurrency past any int", with(map[string]string{"host.s390x-1.concurrency": "99999999999999999999"}), Error, "host.s390x-1.concurrency", "must be 1 or more"},
		{"concurrency word", with(map[string]string{"host.s390x-1.concurrency": "four"}), Error, "host.s390x-1.concurrency", `"four" is not a whole number`},
		{"concurrency missing", with(nil, "host.s390x-1.concurrency"), Warning, "host.s390x-1.concurrency", "one build at a time"},
		{"host name too long", with(map[string]string{"host." + strings.Repeat("a", 70) + ".address": "10.0.0.1"}), Error, "host." + strings.Repeat("a", 70) + ".address", "at most 63"},
		{"host key garbage", with(map[string]string{"host.s390x-1.host-key": "fingerprint"}), Error, "host.s390x-1.host-key", "not a public key"},
		{"host key form", map[string]string{"host.address": "1.2.3.4"}, Warning, "host.address", "host.<name>.<field>"},
		// dynamic platforms
		{"dynamic without type", with(nil, "dynamic.linux-arm64.type"), Error, "dynamic.linux-arm64.type", "missing; it is required"},
		{"dynamic without max-instances", with(nil, "dynamic.linux-arm64.max-instances"), Error, "dynamic.linux-arm64.max-instances", "missing; it is required"},
		{"dynamic without ssh-secret", with(nil, "dynamic.linux-arm64.ssh-secret"), Error, "dynamic.linux-arm64.ssh-secret", "missing; it is required"},
		{"dynamic listed without settings", with(map[string]string{"dynamic-platforms": "linux/arm64,linux/riscv64"}), Error, "dynamic.linux-riscv64.type", "no dynamic.linux-riscv64.* settings"},
		{"provider type typo", with(map[string]string{"dynamic.linux-arm64.type": "asw"}), Error, "dynamic.linux-arm64.type", "did you mean aws?"},
		{"provider key missing", with(nil, "dynamic.linux-arm64.ami"), Error, "dynamic.linux-arm64.ami", "missing; it is required"},
		{"max-instances word", with(map[string]string{"dynamic.linux-arm64.max-instances": "ten"}), Error, "dynamic.linux-arm64.max-instances", `"ten" is not a whole number`},
		{"allocation-timeout negative", with(map[string]string{"dynamic.linux-arm64.allocation-timeout": "-5"}), Error, "dynamic.linux-arm64.allocation-timeout", "out of range"},
		{"check-interval word", with(map[string]string{"dynamic.linux-arm64.check-interval": "1m"}), Error, "dynamic.linux-arm64.check-interval", `"1m" is not a whole number`},
		{"bool that is not", with(map[string]string{"dynamic.linux-arm64.strict-public-address": "yes please"}), Error, "dynamic.linux-arm64.strict-public-address", "not true or false"},
		{"cores not a number", with(map[string]string{"dynamic.linux-ppc64le.cores": "a quarter"}), Error, "dynamic.linux-ppc64le.cores", "not a positive number"},
		{"sudo command with shell", with(map[string]string{"dynamic.linux-arm64.sudo-commands": "/usr/bin/podman; rm -rf /"}), Error, "dynamic.linux-arm64.sudo-commands", "is not allowed"},
		{"sudo command relative", with(map[string]string{"dynamic.linux-arm64.sudo-commands": "podman"}), Error, "dynamic.linux-arm64.sudo-commands", "absolute path"},
		{"dynamic settings of a local platform", with(map[string]string{"local-platforms": "local,linux/riscv64", "dynamic.linux-riscv64.type": "aws"}), Warning, "dynamic.linux-riscv64.*", "ignored"},
		{"settings of an unlisted platform", with(map[string]string{"dynamic.linux-riscv64.type": "aws"}), Warning, "dynamic.linux-riscv64.*", "ignored"},
		// pools
		{"pool concurrency zero", with(map[string]string{"dynamic.linux-ppc64le.concurrency": "0"}), Error, "dynamic.linux-ppc64le.concurrency", "out of range"},
		{"pool max-age past time.Duration", with(map[string]string{"dynamic.linux-ppc64le.max-age": "200000000"}), Error, "dynamic.linux-ppc64le.max-age", "from 1 to 153722867"},
		{"pool without max-age", with(nil, "dynamic.linux-ppc64le.max-age"), Error, "dynamic.linux-ppc64le.max-age", "missing; it is required"},
		{"pool without concurrency", with(nil, "dynamic.linux-ppc64le.concurrency"), Error, "dynamic.linux-ppc64le.concurrency", "missing; it is required"},
		{"pool key on plain dynamic", with(map[string]string{"dynamic.linux-arm64.concurrency": "4"}), Warning, "dynamic.linux-arm64.concurrency", "only platforms in dynamic-pool-platforms"},
		{"max-age on dynamic without min-idle", with(map[string]string{"dynamic.linux-arm64.max-age": "60"}), Warning, "dynamic.linux-arm64.max-age", "min-idle is not set"},
		{"min-idle out of range", with(map[string]string{"dynamic.linux-arm64.min-idle": "-1"}), Error, "dynamic.linux-arm64.min-idle", ""},
		// unknown keys
		{"global typo", with(map[string]string{"alowed-namespaces": "x"}), Warning, "alowed-namespaces", "did you mean allowed-namespaces?"},
		{"section typo", with(map[string]string{"hosts.a.address": "x"}), Warning, "hosts.a.address", "did you mean host.<name>.<field>?"},
		{"host field typo", with(map[string]string{"host.s390x-1.concurency": "2"}), Warning, "host.s390x-1.concurency", "did you mean concurrency?"},
		{"dynamic field typo", with(map[string]string{"dynamic.linux-arm64.regoin": "x"}), Warning, "dynamic.linux-arm64.regoin", "did you mean region?"},
		{"other provider's key", with(map[string]string{"dynamic.linux-arm64.crn": "x"}), Warning, "dynamic.linux-arm64.crn", "setting of type ibmp, and this platform's type is aws"},
		{"unknown with no suggestion", with(map[string]string{"zzzzzzzz": "x"}), Warning, "zzzzzzzz", "unknown key"},
		// globals
		{"namespace regex broken", with(map[string]string{"allowed-namespaces": "team-(a"}), Warning, "allowed-namespaces", "only a namespace of exactly that name"},
		{"tags not pairs", with(map[string]string{"additional-instance-tags": "team=builds,oops"}), Warning, "additional-instance-tags", `"oops" is not key=value`},
		{"namespace cap zero", with(map[string]string{"max-tasks-per-namespace": "0"}), Error, "max-tasks-per-namespace", "0 is out of range"},
		{"namespace cap negative", with(map[string]string{"max-tasks-per-namespace": "-3"}), Error, "max-tasks-per-namespace", "out of range"},
		{"namespace cap word", with(map[string]string{"max-tasks-per-namespace": "few"}), Error, "max-tasks-per-namespace", `"few" is not a whole number`},
		{"namespace cap empty", with(map[string]string{"max-tasks-per-namespace": " "}), Error, "max-tasks-per-namespace", "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, problems := Parse(tc.data)
			for _, p := range problems {
				if p.Severity == tc.severity && p.Key == tc.key && strings.Contains(p.Message, tc.contains) {
					return
				}
			}
			t.Fatalf("want %s on %s containing %q; got:\n%s", tc.severity, tc.key, tc.contains, strings.ReplaceAll(problems.Summary(), "; ", "\n"))
		})
	}
}

// TestLargeValuesLoad: no count has an upper bound of berth's own (no system it talks to
// documents one, and production exceeds guesses): values far beyond today's production load
// as they are, with no problem.
func TestLargeValuesLoad(t *testing.T) {
	large := map[string]string{
		"host.s390x-1.concurrency":               "400",
		"dynamic.linux-arm64.max-instances":      "5000",
		"dynamic.linux-arm64.allocation-timeout": "172800",
		"dynamic.linux-ppc64le.max-instances":    "1000",
		"dynamic.linux-ppc64le.concurrency":      "256",
		"dynamic.linux-ppc64le.max-age":          "10080",
		"max-tasks-per-namespace":                "50000",
	}
	cfg, problems := Parse(with(large))
	for key := range large {
		for _, p := range problems {
			if p.Key == key {
				t.Errorf("%s=%s: %s", key, large[key], p)
			}
		}
	}
	if h := cfg.Host("s390x-1"); h == nil || h.Concurrency != 400 {
		t.Errorf("host s390x-1: %+v, want concurrency 400", h)
	}
	arm, ppc := cfg.Dynamic["linux/arm64"], cfg.Dynamic["linux/ppc64le"]
	if arm == nil || arm.MaxInstances != 5000 || arm.AllocationTimeout != 48*time.Hour {
		t.Errorf("linux/arm64: %+v, want 5000 VMs and 48h to allocate", arm)
	}
	if ppc == nil || ppc.MaxInstances != 1000 || ppc.Pool == nil || ppc.Pool.Concurrency != 256 || ppc.Pool.MaxAge != 7*24*time.Hour {
		t.Errorf("linux/ppc64le: %+v, want 1000 VMs of 256 builds living a week", ppc)
	}
	if cfg.MaxTasksPerNamespace != 50000 {
		t.Errorf("max-tasks-per-namespace %d, want 50000", cfg.MaxTasksPerNamespace)
	}
}

func TestAllProblemsAreCollected(t *testing.T) {
	_, problems := Parse(with(map[string]string{
		"host.s390x-1.concurrency":          "zero",
		"dynamic.linux-arm64.max-instances": "many",
		"max-tasks-per-namespace":           "lots",
	}, "host.s390x-2.secret"))
	want := []string{"dynamic.linux-arm64.max-instances", "host.s390x-1.concurrency", "host.s390x-2.secret", "max-tasks-per-namespace"}
	errs := problems.Errors()
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d: %s", len(errs), len(want), errs.Summary())
	}
	for i, p := range errs {
		if p.Key != want[i] {
			t.Errorf("error %d is about %s, want %s (errors sorted by key)", i, p.Key, want[i])
		}
	}
}

func TestSuggest(t *testing.T) {
	for _, tc := range []struct{ word, want string }{
		{"concurency", "concurrency"},
		{"adress", "address"},
		{"platfrom", "platform"},
		{"xyz", ""},
	} {
		if got := suggest(tc.word, []string{"address", "concurrency", "platform", "secret", "user"}); got != tc.want {
			t.Errorf("suggest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
}

func TestNamespaceCap(t *testing.T) {
	cfg, problems := Parse(with(map[string]string{"max-tasks-per-namespace": "3"}))
	if problems.HasErrors() || cfg.MaxTasksPerNamespace != 3 {
		t.Fatalf("cap 3: %d, %v", cfg.MaxTasksPerNamespace, problems)
	}
	if cfg, _ := Parse(with(nil)); cfg.MaxTasksPerNamespace != 0 {
		t.Fatalf("no key: cap %d, want 0 (none)", cfg.MaxTasksPerNamespace)
	}
}

// TestAWindowsPlatformLoadsAsProductionRendersIt: production's Windows user-data leaves
// sshd_config as OpenSSH installs it; berth's build users then get their keys in their own
// profile (see hostops), so such a platform loads with no problem at all, as one whose
// user-data adds berth's Match block does.
func TestAWindowsPlatformLoadsAsProductionRendersIt(t *testing.T) {
	for _, userData := range []string{
		"<powershell>\nStart-Service sshd\n</powershell>",
		"<powershell>\nAdd-Content $env:ProgramData\\ssh\\sshd_config \"Match User u-*`n  AuthorizedKeysFile __PROGRAMDATA__/ssh/berth/%u/authorized_keys\"\n</powershell>",
		"",
	} {
		d := map[string]string{"dynamic-platforms": "windows-4xlarge/amd64"}
		for k, v := range base() {
			if rest, ok := strings.CutPrefix(k, "dynamic.linux-arm64."); ok && rest != "sudo-commands" {
				d["dynamic.windows-4xlarge-amd64."+rest] = v
			}
		}
		if userData != "" {
			d["dynamic.windows-4xlarge-amd64.user-data"] = userData
		}
		cfg, problems := Parse(d)
		if !cfg.Usable("windows-4xlarge/amd64") || len(problems) > 0 {
			t.Errorf("user-data %.40q: usable %v, problems %v; want usable and none", userData, cfg.Usable("windows-4xlarge/amd64"), problems)
		}
	}
}
