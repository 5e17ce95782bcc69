package config

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// knownBare pins what ../shared/real/README.md says of the files it names, so a loader that
// took every platform as bare could not pass.
var knownBare = map[string][]Platform{
	"production/production-downstream-kflux-rhel-p01.host-config.yaml": {"linux-g6xlarge/amd64"},
	"production/production-downstream-pentest-p01.host-config.yaml":    {"linux-g6xlarge/amd64"},
	"upstream-examples/deploy_overlays_dev-template_host-config.yaml":  {"linux/s390x"},
	"rendered/production-kflux-fedora-01.yaml":                         {"linux-g4xlarge/amd64", "linux-g6xlarge/arm64"},
	"rendered/production-kflux-prd-rh02.yaml":                          {"linux-g4xlarge/amd64"},
}

func realConfigs(t *testing.T) []realdata.HostConfig {
	t.Helper()
	files, err := realdata.HostConfigs()
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestEveryRealConfigLoads: every platform the real clusters list is served, but those listed
// bare, which fail alone.
func TestEveryRealConfigLoads(t *testing.T) {
	files := realConfigs(t)
	for name := range knownBare {
		if !slices.ContainsFunc(files, func(f realdata.HostConfig) bool { return f.Name == name }) {
			t.Errorf("%s is not among the real configs", name)
		}
	}
	for _, f := range files {
		t.Run(f.Name, func(t *testing.T) {
			cfg, _ := Parse(f.Data)
			if len(cfg.Fatal()) != 0 {
				t.Fatalf("unusable as a whole: %s", cfg.Fatal().Summary())
			}
			if len(cfg.Platforms) == 0 {
				t.Fatal("no platform")
			}
			var unusable []Platform
			for _, p := range slices.Sorted(maps.Keys(cfg.Platforms)) {
				if !cfg.Usable(p) {
					unusable = append(unusable, p)
				}
			}
			var want []Platform
			for _, p := range f.BareListed() {
				want = append(want, Platform(p))
			}
			if known, ok := knownBare[f.Name]; ok && !slices.Equal(want, known) {
				t.Fatalf("bare-listed platforms %v, want %v as ../shared/real/README.md says", want, known)
			}
			if !slices.Equal(unusable, want) {
				t.Fatalf("unusable platforms %v, want %v; problems:\n%s", unusable, want, strings.ReplaceAll(cfg.Problems().Summary(), "; ", "\n"))
			}
			for _, p := range unusable {
				if _, listedBare := f.Data[dynamicKey(p, "type")]; listedBare {
					t.Errorf("%s has settings, yet it is unusable: %s", p, cfg.Broken(p).Summary())
				}
				if b := cfg.Broken(p); len(b) != 1 || b[0].Key != dynamicKey(p, "type") || !strings.Contains(b[0].Message, "no dynamic."+p.Label()+".* settings") {
					t.Errorf("%s: want one error saying it has no settings, got %v", p, b)
				}
			}
			for _, r := range cfg.Report() {
				if r.Usable && r.Strategy != StrategyLocal && r.Capacity < 1 {
					t.Errorf("%s is usable with capacity %d", r.Platform, r.Capacity)
				}
			}
		})
	}
}

// TestARealConfigBrokenInOnePlaceHarmsOnlyThatPlatform derives broken variants of every real
// config and checks that only the platform touched loses service.
func TestARealConfigBrokenInOnePlaceHarmsOnlyThatPlatform(t *testing.T) {
	for _, f := range realConfigs(t) {
		good, _ := Parse(f.Data)
		usable := good.UsablePlatforms()
		var victim Platform
		for _, p := range usable {
			if good.Dynamic[p] != nil {
				victim = p
				break
			}
		}
		if victim == "" {
			continue // no dynamic platform to break (the local example)
		}
		typoed := maps.Clone(f.Data)
		typoed[dynamicKey(victim, "ssh-secrte")] = typoed[dynamicKey(victim, "ssh-secret")]
		delete(typoed, dynamicKey(victim, "ssh-secret"))
		dropped := maps.Clone(f.Data)
		delete(dropped, dynamicKey(victim, "type"))
		badNumber := maps.Clone(f.Data)
		badNumber[dynamicKey(victim, "max-instances")] = "20 VMs"
		for variant, tc := range map[string]struct {
			data map[string]string
			want string
		}{
			"typo":       {typoed, "ssh-secrte is set: did you mean ssh-secret?"},
			"dropped":    {dropped, "type: missing; it is required"},
			"bad number": {badNumber, `"20 VMs" is not a whole number`},
		} {
			t.Run(f.Name+"/"+variant, func(t *testing.T) {
				cfg, _ := Parse(tc.data)
				if len(cfg.Fatal()) != 0 {
					t.Fatalf("unusable as a whole: %s", cfg.Fatal().Summary())
				}
				if b := cfg.Broken(victim); cfg.Usable(victim) || !strings.Contains(b.Summary(), tc.want) {
					t.Errorf("%s: usable %v, broken by %q; want %q", victim, cfg.Usable(victim), b.Summary(), tc.want)
				}
				want := slices.DeleteFunc(slices.Clone(usable), func(p Platform) bool { return p == victim })
				if got := cfg.UsablePlatforms(); !slices.Equal(got, want) {
					t.Errorf("usable platforms changed beyond %s:\n got %v\nwant %v", victim, got, want)
				}
			})
		}
	}
}

// TestARealStaticHostBrokenIsLeftOutAlone breaks one static host of every real config that has
// some: its pool serves with the rest.
func TestARealStaticHostBrokenIsLeftOutAlone(t *testing.T) {
	tried := 0
	for _, f := range realConfigs(t) {
		good, _ := Parse(f.Data)
		if len(good.Hosts) == 0 {
			continue
		}
		tried++
		h := good.Hosts[0]
		data := maps.Clone(f.Data)
		data[hostKey(h.Name, "address")] = "not an address"
		cfg, _ := Parse(data)
		if cfg.Host(h.Name) != nil {
			t.Errorf("%s: host %s with a bad address is still in its pool", f.Name, h.Name)
		}
		if got, want := len(cfg.Hosts), len(good.Hosts)-1; got != want {
			t.Errorf("%s: %d hosts left, want %d", f.Name, got, want)
		}
		if others := len(good.HostsFor(h.Platform)) - 1; cfg.Usable(h.Platform) != (others > 0) {
			t.Errorf("%s: %s usable %v with %d other host(s)", f.Name, h.Platform, cfg.Usable(h.Platform), others)
		}
		if got, want := len(cfg.UsablePlatforms()), len(good.UsablePlatforms()); cfg.Usable(h.Platform) && got != want {
			t.Errorf("%s: %d usable platforms, want %d", f.Name, got, want)
		}
	}
	if tried == 0 {
		t.Fatal("no real config has static hosts: the test proves nothing")
	}
}

// BenchmarkParseRealConfigs parses and merges every real config once per iteration: the work a
// hot reload does before it can swap the config in.
func BenchmarkParseRealConfigs(b *testing.B) {
	files, err := realdata.HostConfigs()
	if err != nil {
		b.Fatal(err)
	}
	prev := make([]*Config, len(files))
	for i, f := range files {
		prev[i], _ = Parse(f.Data)
	}
	b.ReportAllocs()
	for b.Loop() {
		for i, f := range files {
			next, _ := Parse(f.Data)
			Merge(prev[i], next)
		}
	}
	b.ReportMetric(float64(len(files)), "configs/op")
}
