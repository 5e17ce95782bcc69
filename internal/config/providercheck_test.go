package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// checkCall is one question Parse asked ProviderCheck.
type checkCall struct {
	typ, platform string
	settings      map[string]string
}

// useChecker makes check the ProviderCheck of one test and returns the questions asked. Tests
// that use it must not run in parallel: ProviderCheck is a package variable.
func useChecker(t *testing.T, check func(typ, platform string, settings map[string]string) error) *[]checkCall {
	t.Helper()
	calls := &[]checkCall{}
	prev := ProviderCheck
	ProviderCheck = func(typ, platform string, settings map[string]string) error {
		*calls = append(*calls, checkCall{typ, platform, maps.Clone(settings)})
		return check(typ, platform, settings)
	}
	t.Cleanup(func() { ProviderCheck = prev })
	return calls
}

// gp3Checker refuses what awsec2's parseSettings refuses of throughput, in its words.
func gp3Checker(typ, platform string, settings map[string]string) error {
	if typ == "aws" && settings["throughput"] == "2000" && settings["iops"] == "3000" {
		return refusal{"throughput", "2000 MiB/s needs at least 8000 iops: gp3 allows 0.25 MiB/s per provisioned IOPS (iops is 3000)"}
	}
	return nil
}

// TestAProviderRefusalMakesOnlyItsPlatformUnusable: a platform whose provider would refuse its
// keys is unusable at load, with the provider's message on the key it names; every other
// platform is served, and a reload keeps the platform's last good settings.
func TestAProviderRefusalMakesOnlyItsPlatformUnusable(t *testing.T) {
	calls := useChecker(t, gp3Checker)
	good, problems := Parse(base())
	if problems.HasErrors() {
		t.Fatalf("the base config has errors: %s", problems.Summary())
	}
	var asked []string
	for _, c := range *calls {
		asked = append(asked, c.typ+" "+c.platform)
		if c.platform == "linux/arm64" && (c.settings["region"] != "us-east-1" || c.settings["disk"] != "200" || c.settings["ssh-secret"] != "") {
			t.Errorf("linux/arm64 was checked with %v; want its provider keys only", c.settings)
		}
	}
	if want := []string{"aws linux/arm64", "ibmp linux/ppc64le"}; !slices.Equal(asked, want) {
		t.Errorf("the checker was asked about %v, want %v", asked, want)
	}

	cfg, problems := Parse(with(map[string]string{"dynamic.linux-arm64.throughput": "2000", "dynamic.linux-arm64.iops": "3000"}))
	if len(cfg.Fatal()) != 0 {
		t.Fatalf("a provider's refusal made the whole config unusable: %s", cfg.Fatal().Summary())
	}
	b := cfg.Broken("linux/arm64")
	if cfg.Usable("linux/arm64") || cfg.Dynamic["linux/arm64"] != nil || len(b) != 1 {
		t.Fatalf("linux/arm64: usable %v, modelled %v, broken by %v; want unusable by one problem", cfg.Usable("linux/arm64"), cfg.Dynamic["linux/arm64"] != nil, b)
	}
	want := Problem{Severity: Error, Platform: "linux/arm64", Key: "dynamic.linux-arm64.throughput",
		Message: "2000 MiB/s needs at least 8000 iops: gp3 allows 0.25 MiB/s per provisioned IOPS (iops is 3000)"}
	if b[0] != want {
		t.Errorf("problem\n %+v\nwant\n %+v", b[0], want)
	}
	if !slices.Contains(problems, want) {
		t.Errorf("Parse did not return the problem: %s", problems.Summary())
	}
	if got, want := cfg.UsablePlatforms(), []Platform{"linux/ppc64le", "linux/s390x", "linux/x86_64", "local"}; !slices.Equal(got, want) {
		t.Errorf("usable platforms %v, want %v", got, want)
	}

	merged, kept := Merge(good, cfg)
	if d := merged.Dynamic["linux/arm64"]; !merged.Usable("linux/arm64") || d == nil || d.Settings["throughput"] != "" {
		t.Errorf("a reload must keep linux/arm64's last good settings: usable %v, %+v", merged.Usable("linux/arm64"), d)
	}
	if len(kept) != 1 || kept[0].Platform != "linux/arm64" || !strings.Contains(kept[0].Problems.Summary(), "gp3 allows") {
		t.Errorf("kept %+v; want linux/arm64, with the provider's message", kept)
	}
}

// refusal is a provider's refusal of one key, as cloud.BadKey makes it.
type refusal struct{ key, reason string }

func (r refusal) Error() string {
	return "setup: bad configuration: platform p: " + r.key + ": " + r.reason
}
func (r refusal) ConfigKey() string { return r.key }
func (r refusal) Reason() string    { return r.reason }

// TestProviderProblemKeys: the problem is on the key the provider's error names, wrapped or
// not, with the provider's reason; an error that names no key, or a key that is not one of
// the type's, is on type, whole.
func TestProviderProblemKeys(t *testing.T) {
	for _, tc := range []struct {
		platform, typ string
		err           error
		key, message  string
	}{
		{"linux/arm64", "aws", refusal{"iops", "16000 needs a disk of at least 32 GiB"},
			"dynamic.linux-arm64.iops", "16000 needs a disk of at least 32 GiB"},
		{"linux/ppc64le", "ibmp", fmt.Errorf("checking: %w", refusal{"crn", `"crn:x": it is not a CRN`}),
			"dynamic.linux-ppc64le.crn", `"crn:x": it is not a CRN`},
		{"linux/ppc64le", "ibmp", errors.New("setup: bad configuration: platform linux/ppc64le: no way to read Secrets was given"),
			"dynamic.linux-ppc64le.type", "the ibmp provider refuses these settings: setup: bad configuration: platform linux/ppc64le: no way to read Secrets was given"},
		{"linux/arm64", "aws", refusal{"colour", "blue"},
			"dynamic.linux-arm64.type", "the aws provider refuses these settings: setup: bad configuration: platform p: colour: blue"},
	} {
		useChecker(t, func(typ, platform string, _ map[string]string) error {
			if platform == tc.platform {
				return tc.err
			}
			return nil
		})
		cfg, _ := Parse(base())
		b := cfg.Broken(Platform(tc.platform))
		if len(b) != 1 || b[0].Key != tc.key || b[0].Message != tc.message {
			t.Errorf("%v: broken by %v; want one problem %s: %s", tc.err, b, tc.key, tc.message)
		}
	}
}

// TestProviderCheckAddsNoSecondMessage: a provider key the config already finds wrong is not
// put to the provider, which would only say it again; an unknown type is not put to it either.
// An error on a key of berth's own does not hide the provider's.
func TestProviderCheckAddsNoSecondMessage(t *testing.T) {
	refuse := func(typ, platform string, _ map[string]string) error {
		return refusal{"region", "required"}
	}
	for _, tc := range []struct {
		name   string
		data   map[string]string
		asked  bool
		broken []string // keys of linux/arm64's problems
	}{
		{"required provider key missing", with(nil, "dynamic.linux-arm64.region"), false, []string{"dynamic.linux-arm64.region"}},
		{"provider bool malformed", with(map[string]string{"dynamic.linux-arm64.strict-public-address": "yes please"}), false,
			[]string{"dynamic.linux-arm64.strict-public-address"}},
		{"unknown type", with(map[string]string{"dynamic.linux-arm64.type": "asw"}), false, []string{"dynamic.linux-arm64.type"}},
		{"own key broken too", with(map[string]string{"dynamic.linux-arm64.max-instances": "ten"}), true,
			[]string{"dynamic.linux-arm64.max-instances", "dynamic.linux-arm64.region"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := useChecker(t, func(typ, platform string, s map[string]string) error {
				if platform == "linux/arm64" {
					return refuse(typ, platform, s)
				}
				return nil
			})
			cfg, _ := Parse(tc.data)
			asked := slices.ContainsFunc(*calls, func(c checkCall) bool { return c.platform == "linux/arm64" })
			if asked != tc.asked {
				t.Errorf("checker asked about linux/arm64: %v, want %v", asked, tc.asked)
			}
			var keys []string
			for _, p := range cfg.Broken("linux/arm64") {
				keys = append(keys, p.Key)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tc.broken) {
				t.Errorf("linux/arm64 broken on %v, want %v: %s", keys, tc.broken, cfg.Broken("linux/arm64").Summary())
			}
			if !cfg.Usable("linux/ppc64le") {
				t.Errorf("linux/ppc64le suffers: %s", cfg.Broken("linux/ppc64le").Summary())
			}
		})
	}
}
