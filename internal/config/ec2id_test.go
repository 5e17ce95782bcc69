package config

import (
	"strings"
	"testing"
)

// A security group or subnet id of the wrong form is a warning that quotes the value and says
// what EC2 will answer; the platform stays in service, as its other keys may all be right and
// EC2 is the judge of its ids. Ids of either length EC2 gives (8 or 17 hex digits) pass quietly.
func TestMalformedEC2IDsAreWarnings(t *testing.T) {
	for _, tc := range []struct {
		key, value, want string // want is "" for a well-formed id
	}{
		{"security-group-id", "SG_ID", "InvalidGroupId.Malformed"},
		{"security-group-id", "launch-wizard-1", "a group's name goes in security-group"},
		{"security-group-id", "sg-0903AEDD465BE979E", "InvalidGroupId.Malformed"},
		{"subnet-id", "SUBNET_ID", "InvalidSubnetID.Malformed"},
		{"subnet-id", "0aa719a6", "InvalidSubnetID.Malformed"},
		{"subnet-id", "subnet-0aa719a6c5b602b1", "InvalidSubnetID.Malformed"}, // 16 digits
		{"security-group-id", "sg-0903aedd465be979e", ""},
		{"security-group-id", "sg-0903aedd", ""},
		{"subnet-id", "subnet-0aa719a6c5b602b16", ""},
		{"subnet-id", "subnet-0aa719a6", ""},
	} {
		key := "dynamic.linux-arm64." + tc.key
		cfg, problems := Parse(with(map[string]string{key: tc.value}))
		if !cfg.Usable("linux/arm64") || cfg.Dynamic["linux/arm64"] == nil {
			t.Errorf("%s=%s: linux/arm64 is not served: %s", tc.key, tc.value, cfg.Broken("linux/arm64").Summary())
			continue
		}
		if got := cfg.Dynamic["linux/arm64"].Settings[tc.key]; got != tc.value {
			t.Errorf("%s=%s: the provider gets %q", tc.key, tc.value, got)
		}
		var about []Problem
		for _, p := range problems {
			if p.Key == key {
				about = append(about, p)
			}
		}
		switch {
		case tc.want == "" && len(about) != 0:
			t.Errorf("%s=%s is well-formed, yet: %v", tc.key, tc.value, about)
		case tc.want != "" && (len(about) != 1 || about[0].Severity != Warning || about[0].Platform != "linux/arm64" ||
			!strings.Contains(about[0].Message, `"`+tc.value+`"`) || !strings.Contains(about[0].Message, tc.want)):
			t.Errorf("%s=%s: want one warning of linux/arm64 quoting the value and saying %q, got %v", tc.key, tc.value, tc.want, about)
		}
	}
}
