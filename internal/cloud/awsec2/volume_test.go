package awsec2

import (
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/cloud"
)

// volumeValues are the required keys of a platform, as the real configs write them, and the
// volume keys of the case on top.
func volumeValues(volume map[string]string) map[string]string {
	v := map[string]string{
		"region":        "us-east-1",
		"ami":           "ami-03d6a5256a46c9feb",
		"instance-type": "m6g.large",
		"key-name":      "konflux-prod-int-mab01",
		"aws-secret":    "aws-account",
	}
	maps.Copy(v, volume)
	return v
}

// Each gp3 limit is accepted at its bound and refused one past it, as BadConfig naming the key
// and the documented rule with its numbers.
func TestVolumeLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		volume map[string]string
		key    string   // the key refused; "" when the values load
		rule   []string // what the message says
	}{
		// disk: gp3 sizes, 1 to 65,536 GiB.
		{name: "disk at its least", volume: map[string]string{"disk": "1"}},
		{name: "disk below its least", volume: map[string]string{"disk": "0"}, key: "disk",
			rule: []string{`"0" is not a whole number from 1 to 65536`, "gp3 limits in GiB"}},
		{name: "disk at its most", volume: map[string]string{"disk": "65536"}},
		{name: "disk past its most", volume: map[string]string{"disk": "65537"}, key: "disk",
			rule: []string{`"65537" is not a whole number from 1 to 65536`, "gp3 limits in GiB"}},

		// iops: gp3 takes 3,000 to 80,000 IOPS.
		{name: "iops at its least", volume: map[string]string{"iops": "3000"}},
		{name: "iops below its least", volume: map[string]string{"iops": "2999"}, key: "iops",
			rule: []string{`"2999" is not a whole number from 3000 to 80000`, "gp3 limits in IOPS"}},
		{name: "iops at its most", volume: map[string]string{"disk": "160", "iops": "80000"}},
		{name: "iops past its most", volume: map[string]string{"disk": "200", "iops": "80001"}, key: "iops",
			rule: []string{`"80001" is not a whole number from 3000 to 80000`, "gp3 limits in IOPS"}},
		{name: "iops of io2 only", volume: map[string]string{"disk": "1000", "iops": "256000"}, key: "iops",
			rule: []string{"from 3000 to 80000"}},

		// throughput: gp3 takes 125 to 2,000 MiB/s.
		{name: "throughput at its least", volume: map[string]string{"throughput": "125"}},
		{name: "throughput below its least", volume: map[string]string{"throughput": "124"}, key: "throughput",
			rule: []string{`"124" is not a whole number from 125 to 2000`, "gp3 limits in MiB/s"}},
		{name: "throughput at its most", volume: map[string]string{"iops": "8000", "throughput": "2000"}},
		{name: "throughput past its most", volume: map[string]string{"iops": "80000", "disk": "160", "throughput": "2001"},
			key: "throughput", rule: []string{`"2001" is not a whole number from 125 to 2000`, "gp3 limits in MiB/s"}},

		// iops at most 500 per GiB of disk, disk 40 GiB when unset; the 3,000 baseline needs no size.
		{name: "iops at 500 per GiB of the default disk", volume: map[string]string{"iops": "20000"}},
		{name: "iops past 500 per GiB of the default disk", volume: map[string]string{"iops": "20001"}, key: "iops",
			rule: []string{"20001 needs a disk of at least 41 GiB", "gp3 allows 500 IOPS per GiB of volume size", "40 GiB when disk is unset"}},
		{name: "iops at 500 per GiB of disk", volume: map[string]string{"disk": "32", "iops": "16000"}},
		{name: "iops past 500 per GiB of disk", volume: map[string]string{"disk": "31", "iops": "16000"}, key: "iops",
			rule: []string{"16000 needs a disk of at least 32 GiB", "gp3 allows 500 IOPS per GiB of volume size", "disk is 31 GiB"}},
		{name: "most iops at the least disk for them", volume: map[string]string{"disk": "160", "iops": "80000"}},
		{name: "most iops on a disk one short", volume: map[string]string{"disk": "159", "iops": "80000"}, key: "iops",
			rule: []string{"80000 needs a disk of at least 160 GiB", "500 IOPS per GiB"}},
		{name: "baseline iops on the least disk", volume: map[string]string{"disk": "1", "iops": "3000"}},
		{name: "past the baseline on a small disk", volume: map[string]string{"disk": "6", "iops": "3001"}, key: "iops",
			rule: []string{"3001 needs a disk of at least 7 GiB", "500 IOPS per GiB", "disk is 6 GiB"}},

		// throughput at most 0.25 MiB/s per provisioned IOPS, iops 3,000 when unset.
		{name: "throughput at 0.25 per baseline IOPS", volume: map[string]string{"throughput": "750"}},
		{name: "throughput past 0.25 per baseline IOPS", volume: map[string]string{"throughput": "751"}, key: "throughput",
			rule: []string{"751 MiB/s needs at least 3004 iops", "gp3 allows 0.25 MiB/s per provisioned IOPS", "3000 when iops is unset"}},
		{name: "throughput at 0.25 per IOPS", volume: map[string]string{"iops": "4000", "throughput": "1000"}},
		{name: "throughput past 0.25 per IOPS", volume: map[string]string{"iops": "3999", "throughput": "1000"}, key: "throughput",
			rule: []string{"1000 MiB/s needs at least 4000 iops", "gp3 allows 0.25 MiB/s per provisioned IOPS", "iops is 3999"}},
		{name: "the brief's example", volume: map[string]string{"throughput": "1000"}, key: "throughput",
			rule: []string{"throughput: 1000 MiB/s needs at least 4000 iops: gp3 allows 0.25 MiB/s per provisioned IOPS (3000 when iops is unset)"}},
		{name: "most throughput one IOPS short", volume: map[string]string{"iops": "7999", "throughput": "2000"}, key: "throughput",
			rule: []string{"2000 MiB/s needs at least 8000 iops"}},

		// The volume of the real configs' largest platforms.
		{name: "real configs' largest volume", volume: map[string]string{"disk": "160", "iops": "16000", "throughput": "1000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseSettings("linux/arm64", volumeValues(tc.volume))
			if tc.key == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if want := tc.volume["iops"]; want != "" && (s.iops == nil || want != strconv.Itoa(int(*s.iops))) {
					t.Errorf("iops %v, want %s", s.iops, want)
				}
				if want := tc.volume["throughput"]; want != "" && (s.throughput == nil || want != strconv.Itoa(int(*s.throughput))) {
					t.Errorf("throughput %v, want %s", s.throughput, want)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded; want %s refused", tc.key)
			}
			if k := cloud.KindOf(err); k != cloud.BadConfig {
				t.Errorf("kind %s, want %s: %v", k, cloud.BadConfig, err)
			}
			for _, m := range append([]string{"platform linux/arm64: " + tc.key + ": "}, tc.rule...) {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not say %q", err, m)
				}
			}
		})
	}
}
