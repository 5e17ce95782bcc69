package config

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// BuildLimits bound one build on a Linux host: per process of its user through
// /etc/security/limits.d (pam_limits applies them at each SSH login), and the build as a
// whole through the user's systemd slice where systemd runs. Set per static host
// (host.<name>.<key>) and per dynamic platform (dynamic.<platform>.<key>); each key left out
// takes DefaultBuildLimits' value.
type BuildLimits struct {
	Processes  LimitPair // nproc: processes and threads of the user
	CPUMinutes LimitPair // cpu: CPU time of each process, in minutes (limits.conf's unit)
	OpenFiles  LimitPair // nofile: open files of each process; not set by default
	// MemoryMax is the slice's MemoryMax= as systemd takes it: a percentage of the host's
	// memory ("90%"), bytes with an optional K, M, G or T suffix, or "infinity"; "" sets none.
	MemoryMax string
	// CPUQuotaPercent is the slice's CPUQuota= in percent of the host's CPUs taken together
	// (90 on a 4-CPU host is CPUQuota=360%); 0 (the key's "none") sets none.
	CPUQuotaPercent int
	// CPUWeight is the slice's CPUWeight=; 0 sets none.
	CPUWeight int
	// TasksMax is the slice's TasksMax=: a count or "infinity"; "" sets none.
	TasksMax string
}

// LimitPair is a limits.conf soft and hard value. Zero is "not set" (a key cannot be 0: see
// parseLimit); Unlimited is limits.conf's "unlimited".
type LimitPair struct{ Soft, Hard int64 }

// Unlimited is a LimitPair value of "unlimited".
const Unlimited int64 = -1

// DefaultBuildLimits are what the upstream controller gives a build user today, in its
// deploy/operator/provision-shared-host.sh at c28c4a01 (as ../shared/real/README.md, last
// section, describes it): nproc 8192 soft / 16384 hard, CPU time 8 h soft / 12 h hard, no
// open-file limit and no TasksMax, and on the user's slice MemoryMax=90%, CPUQuota 90% of the
// host's CPUs and CPUWeight=100. Its tighter limits of January 2026 (TasksMax=4096, nproc
// 4096, open files) broke real builds (LLVM, large payloads, 300k open files) and were lifted
// within weeks; the slice's bounds keep the host's own sshd and agents alive instead.
var DefaultBuildLimits = BuildLimits{
	Processes:       LimitPair{Soft: 8192, Hard: 16384},
	CPUMinutes:      LimitPair{Soft: 8 * 60, Hard: 12 * 60},
	MemoryMax:       "90%",
	CPUQuotaPercent: 90,
	CPUWeight:       100,
}

// The keys of BuildLimits, in host.<name>.* and dynamic.<platform>.* alike.
const (
	keyNprocSoft  = "nproc-soft"
	keyNprocHard  = "nproc-hard"
	keyCPUSoft    = "cpu-minutes-soft"
	keyCPUHard    = "cpu-minutes-hard"
	keyNofileSoft = "nofile-soft"
	keyNofileHard = "nofile-hard"
	keyMemoryMax  = "memory-max"
	keyCPUQuota   = "cpu-quota"
	keyCPUWeight  = "cpu-weight"
	keyTasksMax   = "tasks-max"
)

// limitKeys are the fields of BuildLimits in the host and dynamic schemas.
var limitKeys = map[string]field{
	keyNprocSoft: {kind: kindString}, keyNprocHard: {kind: kindString},
	keyCPUSoft: {kind: kindString}, keyCPUHard: {kind: kindString},
	keyNofileSoft: {kind: kindString}, keyNofileHard: {kind: kindString},
	keyMemoryMax: {kind: kindString}, keyCPUQuota: {kind: kindString},
	keyCPUWeight: {kind: kindString}, keyTasksMax: {kind: kindString},
}

// LimitError is a limit key's value that cannot be used.
type LimitError struct {
	Key    string
	Reason string
}

func (e *LimitError) Error() string { return e.Key + ": " + e.Reason }

// ParseBuildLimits reads the limit keys of fields (a host's or a platform's; other keys are
// ignored) over DefaultBuildLimits. It returns every bad key's error, each a *LimitError.
func ParseBuildLimits(fields map[string]string) (BuildLimits, []error) {
	l := DefaultBuildLimits
	var errs []error
	fail := func(key, format string, args ...any) {
		errs = append(errs, &LimitError{Key: key, Reason: fmt.Sprintf(format, args...)})
	}
	l.Processes = parsePair(fields, keyNprocSoft, keyNprocHard, "processes", DefaultBuildLimits.Processes, fail)
	l.CPUMinutes = parsePair(fields, keyCPUSoft, keyCPUHard, "minutes of CPU time", DefaultBuildLimits.CPUMinutes, fail)
	l.OpenFiles = parsePair(fields, keyNofileSoft, keyNofileHard, "open files", DefaultBuildLimits.OpenFiles, fail)
	if raw, ok := fields[keyMemoryMax]; ok {
		if err := checkMemoryMax(raw); err != nil {
			fail(keyMemoryMax, "%v", err)
		} else {
			l.MemoryMax = raw
		}
	}
	if raw, ok := fields[keyCPUQuota]; ok && raw == "none" {
		l.CPUQuotaPercent = 0
	} else if ok {
		// systemd refuses a CPUQuota= of 0% or less (systemd.resource-control(5): "Takes a
		// percentage value"; it ignores values that are not positive); no upper bound: above
		// 100% of the host's CPUs is no bound at all, but systemd takes it.
		n, err := strconv.Atoi(strings.TrimSuffix(raw, "%"))
		if err != nil || n < 1 {
			fail(keyCPUQuota, "%q is not a whole percentage of the host's CPUs of at least 1, like 90%%, or none", raw)
		} else {
			l.CPUQuotaPercent = n
		}
	}
	if raw, ok := fields[keyCPUWeight]; ok {
		// systemd.resource-control(5): CPUWeight= "takes an integer value ... in the range 1…10000".
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 10000 {
			fail(keyCPUWeight, "%q is not a whole number from 1 to 10000, the range systemd takes for CPUWeight= (systemd.resource-control(5))", raw)
		} else {
			l.CPUWeight = n
		}
	}
	if raw, ok := fields[keyTasksMax]; ok {
		if n, err := strconv.ParseUint(raw, 10, 64); raw != "infinity" && (err != nil || n == 0) {
			fail(keyTasksMax, "%q is neither a whole number of at least 1 nor infinity (what systemd takes for TasksMax=, systemd.resource-control(5))", raw)
		} else {
			l.TasksMax = raw
		}
	}
	return l, errs
}

// parsePair reads a soft and a hard limit. A key left out takes the default, moved only as far
// as the other key needs: nproc-hard 2000 alone lowers the soft limit to 2000 too, nproc-soft
// 20000 alone raises the hard limit to 20000, so setting one never makes an unusable pair;
// where there is no default (nofile), one key alone sets both.
// Both set with soft above hard is an error: pam_limits cannot set such a pair (setrlimit(2)
// refuses a soft limit above the hard one with EINVAL).
func parsePair(fields map[string]string, softKey, hardKey, what string, def LimitPair, fail func(key, format string, args ...any)) LimitPair {
	rawSoft, hasSoft := fields[softKey]
	rawHard, hasHard := fields[hardKey]
	soft, softErr := parseLimit(rawSoft, what)
	hard, hardErr := parseLimit(rawHard, what)
	if hasSoft && softErr != nil {
		fail(softKey, "%v", softErr)
	}
	if hasHard && hardErr != nil {
		fail(hardKey, "%v", hardErr)
	}
	if hasSoft && softErr != nil || hasHard && hardErr != nil {
		return def
	}
	switch {
	case hasSoft && hasHard:
		if above(soft, hard) {
			fail(softKey, "the soft limit %s is above the hard limit %s (%s); a process cannot have a soft limit above its hard one (setrlimit(2))",
				limitText(soft), limitText(hard), hardKey)
			return def
		}
		return LimitPair{Soft: soft, Hard: hard}
	case hasSoft:
		out := LimitPair{Soft: soft, Hard: def.Hard}
		if def.Hard == 0 || above(soft, def.Hard) {
			out.Hard = soft
		}
		return out
	case hasHard:
		out := LimitPair{Soft: def.Soft, Hard: hard}
		if def.Soft == 0 || above(def.Soft, hard) {
			out.Soft = hard
		}
		return out
	}
	return def
}

// parseLimit reads a limits.conf value: a whole number, or unlimited (limits.conf(5) also
// takes -1 and infinity for it). 0 is refused though limits.conf takes it: it does not mean
// "no limit" there but "none at all" (no process can fork, or open a file), which no build
// survives, and is an easy misreading of the key.
func parseLimit(raw, what string) (int64, error) {
	switch raw {
	case "unlimited", "infinity", "-1":
		return Unlimited, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a number of %s of at least 1, or unlimited (0 is not \"no limit\" in limits.conf: it allows none)", raw, what)
	}
	return n, nil
}

func above(a, b int64) bool { return b != Unlimited && (a == Unlimited || a > b) }

func limitText(n int64) string {
	if n == Unlimited {
		return "unlimited"
	}
	return strconv.FormatInt(n, 10)
}

// memoryMaxRE is what systemd.resource-control(5) takes for MemoryMax=: bytes with an
// optional K, M, G or T suffix (base 1024), a percentage of physical memory, or infinity.
var memoryMaxRE = regexp.MustCompile(`^(infinity|[0-9]+[KMGT]?|[0-9]+(\.[0-9]+)?%)$`)

func checkMemoryMax(raw string) error {
	if !memoryMaxRE.MatchString(raw) {
		return fmt.Errorf("%q is not a MemoryMax= systemd takes: a percentage of the host's memory like 90%%, bytes like 8G (suffix K, M, G or T), or infinity (systemd.resource-control(5))", raw)
	}
	if pct, ok := strings.CutSuffix(raw, "%"); ok {
		// A percentage is of the host's physical memory: systemd refuses one above 100%.
		if v, _ := strconv.ParseFloat(pct, 64); v <= 0 || v > 100 {
			return fmt.Errorf("%q: a percentage of the host's memory must be above 0%% and at most 100%% (systemd.resource-control(5))", raw)
		}
	}
	return nil
}

// String is the limits as limit keys, "key=value" joined by commas in key order: what the
// provision TaskRun carries (its LIMITS param) and ParseBuildLimitsText reads back.
func (l BuildLimits) String() string {
	kv := map[string]string{
		keyNprocSoft: limitText(l.Processes.Soft), keyNprocHard: limitText(l.Processes.Hard),
		keyCPUSoft: limitText(l.CPUMinutes.Soft), keyCPUHard: limitText(l.CPUMinutes.Hard),
	}
	if l.OpenFiles.Soft != 0 {
		kv[keyNofileSoft] = limitText(l.OpenFiles.Soft)
	}
	if l.OpenFiles.Hard != 0 {
		kv[keyNofileHard] = limitText(l.OpenFiles.Hard)
	}
	if l.MemoryMax != "" {
		kv[keyMemoryMax] = l.MemoryMax
	}
	kv[keyCPUQuota] = "none"
	if l.CPUQuotaPercent != 0 {
		kv[keyCPUQuota] = strconv.Itoa(l.CPUQuotaPercent) + "%"
	}
	if l.CPUWeight != 0 {
		kv[keyCPUWeight] = strconv.Itoa(l.CPUWeight)
	}
	if l.TasksMax != "" {
		kv[keyTasksMax] = l.TasksMax
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		parts = append(parts, k+"="+kv[k])
	}
	return strings.Join(parts, ",")
}

// ParseBuildLimitsText reads String's form; "" is DefaultBuildLimits. A key it leaves out is
// not set, except those DefaultBuildLimits sets, which take their default.
func ParseBuildLimitsText(text string) (BuildLimits, error) {
	fields := map[string]string{}
	for _, kv := range splitList(text) {
		k, v, ok := strings.Cut(kv, "=")
		if _, known := limitKeys[k]; !ok || !known {
			return BuildLimits{}, fmt.Errorf("%q is not a limit key=value (keys: %s)", kv, strings.Join(slices.Sorted(maps.Keys(limitKeys)), ", "))
		}
		fields[k] = v
	}
	l, errs := ParseBuildLimits(fields)
	return l, errors.Join(errs...)
}
