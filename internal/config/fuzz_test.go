package config

import (
	"strings"
	"testing"
)

// FuzzParse feeds the parser ConfigMap data written as key=value lines. Whatever the input, the
// parser must not panic, every problem must name a key and say something, errors come first,
// and whatever the config calls usable must be something the allocator can trust.
func FuzzParse(f *testing.F) {
	var b strings.Builder
	for k, v := range base() {
		b.WriteString(k + "=" + v + "\n")
	}
	f.Add(b.String())
	f.Add("local-platforms=linux/arm64,,\ndynamic-platforms=linux/arm64\n")
	f.Add("host.a.address=10.0.0.1\nhost.a.concurrency=99999999999999999999\nhost.a.platform=linux/s390x\n")
	f.Add("host..address=x\ndynamic.=y\nhost.a.=z\n.=.\n")
	f.Add("dynamic-pool-platforms=linux/ppc64le\ndynamic.linux-ppc64le.type=ibmp\ndynamic.linux-ppc64le.max-age=-1\n")
	f.Add("allowed-namespaces=(((\nadditional-instance-tags==,=\n")
	f.Fuzz(func(t *testing.T, input string) {
		data := map[string]string{}
		for _, line := range strings.Split(input, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				data[k] = v
			}
		}
		cfg, problems := Parse(data)
		if cfg == nil {
			t.Fatal("Parse returned no config")
		}
		sawWarning := false
		for _, p := range problems {
			if p.Key == "" || p.Message == "" {
				t.Fatalf("problem without key or message: %+v", p)
			}
			if p.Severity == Warning {
				sawWarning = true
			} else if sawWarning {
				t.Fatalf("an error after a warning: %s", problems.Summary())
			}
		}
		if !problems.HasErrors() && len(cfg.UsablePlatforms()) != len(cfg.Platforms) {
			t.Fatalf("a platform is unusable in a config without errors: %v", cfg.Platforms)
		}
		for platform, strategy := range cfg.Platforms {
			if !cfg.Usable(platform) {
				if len(cfg.Broken(platform)) == 0 {
					t.Fatalf("%s is unusable and nothing says why", platform)
				}
				continue
			}
			if strategy == StrategyStatic && len(cfg.HostsFor(platform)) == 0 {
				t.Fatalf("static platform %s is usable without a host", platform)
			}
			if strategy == StrategyDynamic || strategy == StrategyDynamicPool {
				d := cfg.Dynamic[platform]
				if d == nil || d.MaxInstances < 1 || d.SSHSecret == "" || (strategy == StrategyDynamicPool) != (d.Pool != nil) {
					t.Fatalf("dynamic platform %s accepted with unusable settings: %+v", platform, d)
				}
				if d.Pool != nil && (d.Pool.Concurrency < 1 || d.Pool.MaxAge <= 0) {
					t.Fatalf("pool %s accepted with %+v", platform, d.Pool)
				}
			}
		}
		for _, h := range cfg.Hosts {
			if h.Concurrency < 1 || h.Address == "" || h.Secret == "" || h.User == "" {
				t.Fatalf("host accepted with unusable settings: %+v", h)
			}
			if s, _ := cfg.Strategy(h.Platform); s != StrategyStatic {
				t.Fatalf("host %s serves %s, whose strategy is %q", h.Name, h.Platform, s)
			}
		}
	})
}
