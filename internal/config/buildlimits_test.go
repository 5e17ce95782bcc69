package config

import (
	"strings"
	"testing"
)

// Without limit keys every static host and dynamic platform gets what the upstream controller
// gives a build user today (../shared/real/README.md, last section), not berth's old nproc 4096
// and TasksMax 4096 that real builds broke on.
func TestBuildLimitsDefaultToUpstreams(t *testing.T) {
	cfg, _ := Parse(base())
	want := BuildLimits{
		Processes:  LimitPair{Soft: 8192, Hard: 16384},
		CPUMinutes: LimitPair{Soft: 480, Hard: 720},
		MemoryMax:  "90%", CPUQuotaPercent: 90, CPUWeight: 100,
	}
	if got := cfg.Host("s390x-1").Limits; got != want {
		t.Errorf("static host limits %+v, want %+v", got, want)
	}
	if got := cfg.Dynamic["linux/arm64"].Limits; got != want {
		t.Errorf("dynamic platform limits %+v, want %+v", got, want)
	}
	if got, _ := cfg.ForBuild("", "linux/ppc64le", true); got != want {
		t.Errorf("pool platform limits %+v, want %+v", got, want)
	}
	if want.OpenFiles != (LimitPair{}) || want.TasksMax != "" {
		t.Fatal("the defaults set an open-file limit or TasksMax")
	}
}

func TestBuildLimitKeysSetPerHostAndPerPlatform(t *testing.T) {
	cfg, problems := Parse(with(map[string]string{
		"host.s390x-1.nproc-hard":              "2000",
		"host.s390x-2.nproc-soft":              "20000",
		"host.s390x-2.cpu-minutes-hard":        "unlimited",
		"dynamic.linux-arm64.nofile-soft":      "1024",
		"dynamic.linux-arm64.nofile-hard":      "524288",
		"dynamic.linux-arm64.memory-max":       "16G",
		"dynamic.linux-arm64.cpu-quota":        "50%",
		"dynamic.linux-arm64.cpu-weight":       "50",
		"dynamic.linux-arm64.tasks-max":        "infinity",
		"dynamic.linux-arm64.cpu-minutes-soft": "-1",
		"dynamic.linux-arm64.cpu-minutes-hard": "infinity",
		"dynamic.linux-ppc64le.cpu-quota":      "none",
		"dynamic.linux-ppc64le.memory-max":     "infinity",
	}))
	for _, p := range problems {
		if p.Severity == Error {
			t.Fatalf("unexpected error: %v", p)
		}
	}
	cases := []struct {
		name      string
		got, want BuildLimits
	}{
		{"hard nproc alone lowers the soft one with it", cfg.Host("s390x-1").Limits, BuildLimits{
			Processes: LimitPair{2000, 2000}, CPUMinutes: LimitPair{480, 720}, MemoryMax: "90%", CPUQuotaPercent: 90, CPUWeight: 100}},
		{"soft nproc alone raises the hard one with it", cfg.Host("s390x-2").Limits, BuildLimits{
			Processes: LimitPair{20000, 20000}, CPUMinutes: LimitPair{480, Unlimited}, MemoryMax: "90%", CPUQuotaPercent: 90, CPUWeight: 100}},
		{"every key of a dynamic platform", cfg.Dynamic["linux/arm64"].Limits, BuildLimits{
			Processes: LimitPair{8192, 16384}, CPUMinutes: LimitPair{Unlimited, Unlimited}, OpenFiles: LimitPair{1024, 524288},
			MemoryMax: "16G", CPUQuotaPercent: 50, CPUWeight: 50, TasksMax: "infinity"}},
		{"slice bounds switched off on a pool", cfg.Dynamic["linux/ppc64le"].Limits, BuildLimits{
			Processes: LimitPair{8192, 16384}, CPUMinutes: LimitPair{480, 720}, MemoryMax: "infinity", CPUWeight: 100}},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, c.got, c.want)
		}
	}
}

// A limit key's bad value is that host's or platform's error, as any other key's: only it is
// out, everything else is served.
func TestABadLimitKeyTakesOutOnlyItsHostOrPlatform(t *testing.T) {
	bad := []struct{ key, value, says string }{
		{"nproc-soft", "lots", "not a number of processes"},
		{"nproc-hard", "0", `0 is not "no limit"`},
		{"cpu-minutes-soft", "1.5", "not a number of minutes of CPU time"},
		{"nofile-hard", "", "not a number of open files"},
		{"memory-max", "120%", "at most 100%"},
		{"memory-max", "8GB", "not a MemoryMax= systemd takes"},
		{"cpu-quota", "0%", "at least 1"},
		{"cpu-weight", "10001", "from 1 to 10000"},
		{"cpu-weight", "0", "from 1 to 10000"},
		{"tasks-max", "0", "at least 1 nor infinity"},
		{"tasks-max", "33%", "at least 1 nor infinity"},
	}
	for _, b := range bad {
		t.Run(b.key+"="+b.value, func(t *testing.T) {
			cfg, _ := Parse(with(map[string]string{"dynamic.linux-arm64." + b.key: b.value}))
			if cfg.Usable("linux/arm64") {
				t.Fatal("the platform is still usable")
			}
			if !hasProblem(cfg.Broken("linux/arm64"), "dynamic.linux-arm64."+b.key, b.says) {
				t.Errorf("no problem on dynamic.linux-arm64.%s saying %q: %v", b.key, b.says, cfg.Broken("linux/arm64"))
			}
			if !cfg.Usable("linux/ppc64le") || !cfg.Usable("linux/s390x") {
				t.Error("another platform became unusable")
			}

			cfg, problems := Parse(with(map[string]string{"host.s390x-1." + b.key: b.value}))
			if cfg.Host("s390x-1") != nil {
				t.Fatal("the host is still served")
			}
			if !hasProblem(problems, "host.s390x-1."+b.key, b.says) {
				t.Errorf("no problem on host.s390x-1.%s saying %q: %v", b.key, b.says, problems)
			}
			if cfg.Host("s390x-2") == nil || !cfg.Usable("linux/s390x") {
				t.Error("the platform's other host is not served")
			}
		})
	}
}

func TestSoftAboveHardIsRefused(t *testing.T) {
	cfg, _ := Parse(with(map[string]string{
		"dynamic.linux-arm64.nproc-soft": "unlimited", "dynamic.linux-arm64.nproc-hard": "10000",
		"host.s390x-1.nofile-soft": "2048", "host.s390x-1.nofile-hard": "1024",
	}))
	if !hasProblem(cfg.Broken("linux/arm64"), "dynamic.linux-arm64.nproc-soft", "above the hard limit 10000") {
		t.Errorf("nproc unlimited over 10000 passed: %v", cfg.Broken("linux/arm64"))
	}
	if cfg.Host("s390x-1") != nil {
		t.Error("a host with nofile 2048 soft over 1024 hard is served")
	}
}

// The provision TaskRun carries the limits as text (LIMITS): what the config decided must be
// what the host gets.
func TestBuildLimitsTextRoundTrips(t *testing.T) {
	for _, l := range []BuildLimits{
		DefaultBuildLimits,
		{Processes: LimitPair{100, Unlimited}, CPUMinutes: LimitPair{1, 2}, OpenFiles: LimitPair{1024, 4096},
			MemoryMax: "512M", CPUWeight: 1, TasksMax: "7"},
	} {
		text := l.String()
		got, err := ParseBuildLimitsText(text)
		if err != nil || got != l {
			t.Errorf("%q read back as %+v (%v), want %+v", text, got, err, l)
		}
	}
	if got, err := ParseBuildLimitsText(""); err != nil || got != DefaultBuildLimits {
		t.Errorf("empty text is %+v (%v), want the defaults", got, err)
	}
	if _, err := ParseBuildLimitsText("nproc=5"); err == nil {
		t.Error("an unknown key was taken")
	}
}

func hasProblem(problems Problems, key, says string) bool {
	for _, p := range problems {
		if p.Key == key && p.Severity == Error && strings.Contains(p.Message, says) {
			return true
		}
	}
	return false
}
