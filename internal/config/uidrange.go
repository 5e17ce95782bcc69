package config

import (
	"fmt"
	"strconv"
	"strings"
)

// UIDRange is the block of user and group IDs berth owns on every Linux build host (berth's own
// global key build-uid-range, "FIRST-LAST", inclusive). Berth cuts it into slices of
// IDsPerBuildUser IDs from First on: a build user's UID and GID are the first ID of its slice
// and its subordinate UIDs and GIDs (/etc/subuid, /etc/subgid) are the other 65535, so no two
// build users ever share an ID, and a clean can find everything one of them left by a plain
// numeric range.
//
// The default, 1879048192-1946157055 (0x70000000-0x73FFFFFF, 1024 build users per host), lies
// where neither shadow nor systemd hands out IDs: above shadow's defaults for normal users
// (login.defs UID_MAX 60000) and for their subordinate ranges (SUB_UID_MIN 100000 to
// SUB_UID_MAX 600100000, plus SUB_UID_COUNT 65536), above systemd's container ranges
// (524288-1879048191, systemd.io/UIDS-GIDS) and below its "foreign" range (from 2147352576)
// and 2^31, past which some programs take IDs for negative numbers. A host whose own users or
// subordinate ranges reach into the range is not broken: the provision skips every slice that
// any passwd, group, subuid or subgid entry touches.
type UIDRange struct {
	First uint32 `json:"first"`
	Last  uint32 `json:"last"`
}

// IDsPerBuildUser is one build user's slice: its own ID and 65535 subordinate IDs, enough for a
// rootless container to map every 16-bit ID an image uses (up to nobody, 65534, and 65535).
const IDsPerBuildUser = 1 << 16

// DefaultUIDRange is the range of a config without build-uid-range; see UIDRange.
var DefaultUIDRange = UIDRange{First: 0x70000000, Last: 0x73FFFFFF}

// maxUID is the highest valid ID: (uid_t)-1 means "no change" to chown and setresuid.
const maxUID = 1<<32 - 2

// buildUIDRangeKey is the global key that sets the UIDRange.
const buildUIDRangeKey = "build-uid-range"

// Users is how many build users the range holds at once on one host (whole slices only).
func (r UIDRange) Users() int {
	if r.Last < r.First {
		return 0
	}
	return int((uint64(r.Last) - uint64(r.First) + 1) / IDsPerBuildUser)
}

// String is the range as the config writes it.
func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// ParseUIDRange reads a value of build-uid-range; empty is the default.
func ParseUIDRange(raw string) (UIDRange, error) {
	value := strings.TrimSpace(raw)
	if value == "" {
		return DefaultUIDRange, nil
	}
	lo, hi, ok := strings.Cut(value, "-")
	first, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return UIDRange{}, fmt.Errorf("%q is not FIRST-LAST, two decimal IDs like %s", value, DefaultUIDRange)
	}
	r := UIDRange{First: uint32(first), Last: uint32(last)}
	switch {
	case r.First == 0:
		return UIDRange{}, fmt.Errorf("%s includes root's ID 0", r)
	case r.Last > maxUID:
		return UIDRange{}, fmt.Errorf("%s reaches past %d, the highest valid ID", r, maxUID)
	case r.Users() == 0:
		return UIDRange{}, fmt.Errorf("%s holds no build user: each takes %d IDs (its own and its subordinate IDs)", r, IDsPerBuildUser)
	}
	return r, nil
}

// parseBuildUIDRange sets the config's BuildUIDs. A bad value is an error of that key alone: on
// a reload the last good range stays in force (see Merge), on a first start the default.
func (p *parser) parseBuildUIDRange() {
	p.cfg.BuildUIDs = DefaultUIDRange
	r, err := ParseUIDRange(p.data[buildUIDRangeKey])
	if err != nil {
		p.globalErrorf(buildUIDRangeKey, "%v", err)
		return
	}
	p.cfg.BuildUIDs = r
}
