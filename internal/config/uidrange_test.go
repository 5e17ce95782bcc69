package config

import (
	"strings"
	"testing"
)

func TestUIDRangeParsesAndCountsWholeSlices(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		want  UIDRange
		users int
		err   string
	}{
		{raw: "", want: DefaultUIDRange, users: 1024},
		{raw: " 1879048192 - 1946157055 ", want: DefaultUIDRange, users: 1024},
		{raw: "200000-265535", want: UIDRange{200000, 265535}, users: 1},
		{raw: "200000-331071", want: UIDRange{200000, 331071}, users: 2},
		{raw: "200000-331070", want: UIDRange{200000, 331070}, users: 1}, // a partial slice is not used
		{raw: "4294901759-4294967294", want: UIDRange{4294901759, 4294967294}, users: 1},
		{raw: "200000-265534", err: "holds no build user"},
		{raw: "0-65535", err: "root"},
		{raw: "4294901760-4294967295", err: "highest valid ID"},
		{raw: "300000-200000", err: "holds no build user"},
		{raw: "200000", err: "FIRST-LAST"},
		{raw: "0x70000000-0x73FFFFFF", err: "FIRST-LAST"},
		{raw: "1-99999999999", err: "FIRST-LAST"},
	} {
		got, err := ParseUIDRange(tc.raw)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseUIDRange(%q) = %v, %v; want an error with %q", tc.raw, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want || got.Users() != tc.users {
			t.Errorf("ParseUIDRange(%q) = %v (%d users), %v; want %v (%d users)", tc.raw, got, got.Users(), err, tc.want, tc.users)
		}
	}
}

// The default must stay clear of what shadow and systemd hand out by default, and below 2^31.
func TestDefaultUIDRangeAvoidsTheHostsOwnIDs(t *testing.T) {
	const (
		loginDefsUIDMax    = 60000                 // login.defs UID_MAX
		loginDefsSubUIDMax = 600100000 + 65536 - 1 // SUB_UID_MAX plus one SUB_UID_COUNT
		systemdContainers  = 1879048191            // last of systemd's container UID ranges
	)
	r := DefaultUIDRange
	if r.First <= loginDefsUIDMax || r.First <= loginDefsSubUIDMax || r.First <= systemdContainers || r.Last >= 1<<31 {
		t.Fatalf("the default range %s overlaps the host's own IDs", r)
	}
	if r.First%IDsPerBuildUser != 0 {
		t.Fatalf("the default range %s does not start on a slice boundary", r)
	}
}

func TestBuildUIDRangeKeyAndReload(t *testing.T) {
	cfg, _ := Parse(map[string]string{"local-platforms": "linux/x86_64", "build-uid-range": "2000000000-2000131071"})
	if len(cfg.Problems()) != 0 || cfg.BuildUIDs != (UIDRange{2000000000, 2000131071}) {
		t.Fatalf("parsed %v with problems %v", cfg.BuildUIDs, cfg.Problems())
	}
	if def, _ := Parse(map[string]string{"local-platforms": "linux/x86_64"}); def.BuildUIDs != DefaultUIDRange {
		t.Fatalf("without the key: %v", def.BuildUIDs)
	}
	bad, _ := Parse(map[string]string{"local-platforms": "linux/x86_64", "build-uid-range": "5-6"})
	if bad.BuildUIDs != DefaultUIDRange || len(bad.Problems()) != 1 || bad.Problems()[0].Key != "build-uid-range" {
		t.Fatalf("a bad range: %v, problems %v", bad.BuildUIDs, bad.Problems())
	}
	merged, kept := Merge(cfg, bad)
	if merged.BuildUIDs != cfg.BuildUIDs || len(kept) != 1 || kept[0].Key != "build-uid-range" {
		t.Fatalf("a bad edit must keep the last good range: %v, kept %v", merged.BuildUIDs, kept)
	}
	data, err := cfg.Snapshot().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := UnmarshalSnapshot(data)
	if err != nil || back.BuildUIDs != cfg.BuildUIDs {
		t.Fatalf("through a snapshot: %v, %v", back, err)
	}
}
