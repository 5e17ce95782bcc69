package localaffinity

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

func TestNodeOf(t *testing.T) {
	for _, tc := range []struct {
		platform string
		want     Node
		ok       bool
	}{
		{"linux/x86_64", Node{"linux", "amd64"}, true},
		{"linux/amd64", Node{"linux", "amd64"}, true},
		{"linux/aarch64", Node{"linux", "arm64"}, true},
		{"linux/arm64", Node{"linux", "arm64"}, true},
		{"linux/ppc64le", Node{"linux", "ppc64le"}, true},
		{"linux/s390x", Node{"linux", "s390x"}, true},
		{"linux/i686", Node{"linux", "386"}, true},
		{"linux/armv7l", Node{"linux", "arm"}, true},
		{"linux/riscv64", Node{"linux", "riscv64"}, true},
		{"windows/amd64", Node{"windows", "amd64"}, true},
		{"darwin/arm64", Node{"darwin", "arm64"}, true},
		// Names that say nothing of a node, or nothing a node reports: no pin.
		{"local", Node{}, false},
		{"localhost", Node{}, false},
		{"test-platform", Node{}, false},
		{"", Node{}, false},
		{"linux/", Node{}, false},
		{"linux-mlarge/amd64", Node{}, false},
		{"freebsd/amd64", Node{}, false},
		{"linux/arm64/v8", Node{}, false},
		{"linux/not a label", Node{}, false},
		{"linux/-arm", Node{}, false},
	} {
		got, ok := NodeOf(tc.platform)
		if got != tc.want || ok != tc.ok {
			t.Errorf("NodeOf(%q) = %+v, %v; want %+v, %v", tc.platform, got, ok, tc.want, tc.ok)
		}
	}
}

var amd64 = Node{OS: "linux", Arch: "amd64"}

func expr(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}

var (
	archAMD64 = expr(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64")
	osLinux   = expr(corev1.LabelOSStable, corev1.NodeSelectorOpIn, "linux")
	zoneA     = expr(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, "a")
	anyArch   = expr(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64", "arm64")
	archARM64 = expr(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "arm64")
	notARM64  = expr(corev1.LabelArchStable, corev1.NodeSelectorOpNotIn, "arm64")
)

func required(terms ...corev1.NodeSelectorTerm) *corev1.NodeAffinity {
	return &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}
}

func term(exprs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: exprs}
}

var preferred = []corev1.PreferredSchedulingTerm{{Weight: 10, Preference: term(zoneA)}}

func TestRequire(t *testing.T) {
	withPreferred := func(na *corev1.NodeAffinity) *corev1.NodeAffinity {
		na.PreferredDuringSchedulingIgnoredDuringExecution = preferred
		return na
	}
	hostname := corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", corev1.NodeSelectorOpIn, "node-1")}}
	for _, tc := range []struct {
		name     string
		in, want *corev1.NodeAffinity
	}{
		{"none", nil, required(term(archAMD64, osLinux))},
		{"no required terms", &corev1.NodeAffinity{}, required(term(archAMD64, osLinux))},
		{"empty term list", required(), required(term(archAMD64, osLinux))},
		{"preferred only: kept, requirement added",
			withPreferred(&corev1.NodeAffinity{}), withPreferred(required(term(archAMD64, osLinux)))},
		{"every term gets it (terms are alternatives)",
			withPreferred(required(term(zoneA), hostname)),
			withPreferred(required(term(zoneA, archAMD64, osLinux),
				corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{archAMD64, osLinux}, MatchFields: hostname.MatchFields}))},
		{"a term allowing several arches is narrowed", required(term(anyArch)), required(term(anyArch, archAMD64, osLinux))},
		{"a conflicting term stays unsatisfiable", required(term(archARM64)), required(term(archARM64, archAMD64, osLinux))},
		{"NotIn is no pin", required(term(notARM64)), required(term(notARM64, archAMD64, osLinux))},
		{"a pinned term is left alone", required(term(osLinux, zoneA, archAMD64)), required(term(osLinux, zoneA, archAMD64))},
		{"only what is missing is added", required(term(archAMD64)), required(term(archAMD64, osLinux))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before *corev1.NodeAffinity
			if tc.in != nil {
				before = tc.in.DeepCopy()
			}
			got := Require(tc.in, amd64)
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Errorf("Require:\n got %+v\nwant %+v", got.RequiredDuringSchedulingIgnoredDuringExecution, tc.want.RequiredDuringSchedulingIgnoredDuringExecution)
			}
			if !equality.Semantic.DeepEqual(tc.in, before) {
				t.Errorf("Require changed its argument: %+v", tc.in)
			}
			if !Enforced(got, amd64) {
				t.Errorf("Enforced is false for what Require made: %+v", got)
			}
			if again := Require(got, amd64); !equality.Semantic.DeepEqual(again, got) {
				t.Errorf("Require is not idempotent:\n once %+v\ntwice %+v", got, again)
			}
		})
	}
}

func TestEnforced(t *testing.T) {
	for _, tc := range []struct {
		name string
		na   *corev1.NodeAffinity
		want bool
	}{
		{"none", nil, false},
		{"no required selector", &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: term(archAMD64, osLinux)}}}, false},
		{"no terms", required(), false},
		{"pinned", required(term(archAMD64, osLinux)), true},
		{"pinned among other requirements", required(term(zoneA, osLinux, anyArch, archAMD64)), true},
		{"a value repeated is still one value", required(term(expr(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64", "amd64"), osLinux)), true},
		{"every term pinned", required(term(archAMD64, osLinux), term(zoneA, archAMD64, osLinux)), true},
		{"one term of two unpinned: a node matching it will do", required(term(archAMD64, osLinux), term(zoneA)), false},
		{"several arches allowed", required(term(anyArch, osLinux)), false},
		{"another arch", required(term(archARM64, osLinux)), false},
		{"NotIn another arch", required(term(notARM64, osLinux)), false},
		{"Exists", required(term(expr(corev1.LabelArchStable, corev1.NodeSelectorOpExists), osLinux)), false},
		{"arch only", required(term(archAMD64)), false},
		{"the arch label as a field", required(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{archAMD64, osLinux}}), false},
		{"the beta label", required(term(expr("beta.kubernetes.io/arch", corev1.NodeSelectorOpIn, "amd64"), osLinux)), false},
	} {
		if got := Enforced(tc.na, amd64); got != tc.want {
			t.Errorf("%s: Enforced = %v, want %v", tc.name, got, tc.want)
		}
	}
}
