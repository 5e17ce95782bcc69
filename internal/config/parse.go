package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Parse reads a host-config ConfigMap's data. It returns the config and every problem found,
// not just the first. Validity is per platform and per host: an error in a platform's settings
// makes only that platform unusable (Broken says why), an error in a static host leaves only
// that host out of its pool, and only a problem of the whole file (Fatal) makes the config
// unusable as a whole. Keys the multi-platform controller accepts and ignores are warnings here.
func Parse(data map[string]string) (*Config, Problems) {
	p := &parser{
		data: data,
		cfg: &Config{
			Platforms: map[Platform]Strategy{},
			Dynamic:   map[Platform]*DynamicPlatform{},
			broken:    map[Platform]Problems{},
			leftOut:   map[string]Problems{},
			badGlobal: map[string]bool{},
		},
		hostFields:    map[string]map[string]string{},
		dynamicFields: map[string]map[string]string{},
	}
	p.classifyKeys()
	p.parseGlobals()
	p.parsePlatformLists()
	p.parseHosts()
	p.parseDynamic()
	if len(p.cfg.Platforms) == 0 {
		p.fatalf("local-platforms", "the config names no platform: set local-platforms, dynamic-platforms, dynamic-pool-platforms or host.<name>.* keys")
	}
	p.problems.sort()
	p.cfg.problems = p.problems
	return p.cfg, p.problems
}

type parser struct {
	data     map[string]string
	cfg      *Config
	problems Problems

	hostFields    map[string]map[string]string // host name → field → value
	dynamicFields map[string]map[string]string // platform label → field → value
	listedIn      map[Platform]string          // platform → the list key that claimed it
	dynamicListed map[string]dynamicEntry      // label → entry of the dynamic lists, conflicting ones too
}

func (p *parser) add(severity Severity, platform Platform, key, format string, args ...any) Problem {
	problem := Problem{Severity: severity, Platform: platform, Key: key, Message: fmt.Sprintf(format, args...)}
	p.problems = append(p.problems, problem)
	return problem
}

// warnf records something berth ignores or works around; it changes nothing that is served.
func (p *parser) warnf(platform Platform, key, format string, args ...any) {
	p.add(Warning, platform, key, format, args...)
}

// platformErrorf records an error that makes one platform unusable.
func (p *parser) platformErrorf(platform Platform, key, format string, args ...any) {
	p.cfg.broken[platform] = append(p.cfg.broken[platform], p.add(Error, platform, key, format, args...))
}

// globalErrorf records a global key whose value berth cannot use: the key takes no effect (the
// last good value stays in force on a reload), every platform is still served.
func (p *parser) globalErrorf(key, format string, args ...any) {
	p.cfg.badGlobal[key] = true
	p.add(Error, "", key, format, args...)
}

// fatalf records a problem of the whole file: nothing in it can be trusted.
func (p *parser) fatalf(key, format string, args ...any) {
	p.cfg.fatal = append(p.cfg.fatal, p.add(Error, "", key, format, args...))
}

// classifyKeys sorts every key into globals, host.<name>.<field> and dynamic.<platform>.<field>,
// and warns about the ones that are none of them: berth ignores them, as the multi-platform
// controller does.
func (p *parser) classifyKeys() {
	for _, key := range slices.Sorted(maps.Keys(p.data)) {
		if _, ok := globalKeys[key]; ok {
			continue
		}
		section, rest, _ := strings.Cut(key, ".")
		dot := strings.LastIndexByte(rest, '.')
		switch {
		case (section == "host" || section == "dynamic") && dot > 0 && dot < len(rest)-1:
			name, field := rest[:dot], rest[dot+1:]
			target := p.hostFields
			if section == "dynamic" {
				target = p.dynamicFields
			}
			if target[name] == nil {
				target[name] = map[string]string{}
			}
			target[name][field] = strings.TrimSpace(p.data[key])
		case section == "host" || section == "dynamic":
			p.warnf("", key, "ignored: %s keys have the form %s.<name>.<field>, like %s", section, section, map[string]string{
				"host": "host.s390x-1.address", "dynamic": "dynamic.linux-arm64.type"}[section])
		default:
			p.unknownKey(key)
		}
	}
}

func (p *parser) unknownKey(key string) {
	if key == "" {
		p.warnf("", `""`, "ignored: a key is empty; every key needs a name")
		return
	}
	candidates := slices.Collect(maps.Keys(globalKeys))
	msg := "unknown key; berth ignores it"
	if s := suggest(key, candidates); s != "" {
		msg += "; did you mean " + s + "?"
	} else if section, _, _ := strings.Cut(key, "."); suggest(section, []string{"host", "dynamic"}) != "" {
		msg += "; did you mean " + suggest(section, []string{"host", "dynamic"}) + ".<name>.<field>?"
	}
	p.warnf("", key, "%s", msg)
}

func (p *parser) parseGlobals() {
	p.cfg.InstanceTag = strings.TrimSpace(p.data["instance-tag"])
	if raw := strings.TrimSpace(p.data["additional-instance-tags"]); raw != "" {
		p.cfg.AdditionalInstanceTags = map[string]string{}
		for _, pair := range splitList(raw) {
			k, v, ok := strings.Cut(pair, "=")
			if !ok || strings.TrimSpace(k) == "" {
				p.warnf("", "additional-instance-tags", "%q is not key=value, so this tag is not set; write tags as k=v,k=v", pair)
				continue
			}
			p.cfg.AdditionalInstanceTags[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if raw, ok := p.data["max-tasks-per-namespace"]; ok {
		if strings.TrimSpace(raw) == "" {
			p.globalErrorf("max-tasks-per-namespace", "empty; write a number, or remove the key for no limit")
		} else {
			p.cfg.MaxTasksPerNamespace = p.intInRange(strings.TrimSpace(raw), 1, noUpperBound, "tasks one namespace may run at once on a platform",
				func(msg string) { p.globalErrorf("max-tasks-per-namespace", "%s", msg) })
		}
	}
	p.parseUserKeyType()
	p.parseBuildUIDRange()
	p.parseAllowedNamespaces()
}

// parseAllowedNamespaces reads berth's namespace allow-list. It is never an error: an entry that
// is not a valid regular expression matches only the namespace of exactly that name, so a typo
// can narrow the list but never open it to everyone.
func (p *parser) parseAllowedNamespaces() {
	for _, ns := range splitList(p.data["allowed-namespaces"]) {
		re, err := regexp.Compile("^(?:" + ns + ")$")
		if err != nil {
			p.warnf("", "allowed-namespaces", "%q is not a valid regular expression (%v), so it allows only a namespace of exactly that name", ns, err)
			if re, err = regexp.Compile("^" + regexp.QuoteMeta(ns) + "$"); err != nil {
				re = matchNothing // not even UTF-8: no namespace can have this name
			}
		}
		p.cfg.AllowedNamespaces = append(p.cfg.AllowedNamespaces, re)
	}
}

var matchNothing = regexp.MustCompile(`[^\x00-\x{10FFFF}]`)

// localPlatformName is what a local platform may be called beyond os/arch: the upstream local
// example uses "test-platform". It must still fit a label value.
var localPlatformName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?)?$`)

// parsePlatformLists reads the three platform lists; a platform may be in only one of them.
func (p *parser) parsePlatformLists() {
	p.listedIn = map[Platform]string{}
	p.dynamicListed = map[string]dynamicEntry{}
	for _, list := range []struct {
		key      string
		strategy Strategy
	}{
		{"local-platforms", StrategyLocal},
		{"dynamic-platforms", StrategyDynamic},
		{"dynamic-pool-platforms", StrategyDynamicPool},
	} {
		items := strings.Split(p.data[list.key], ",")
		for i, item := range items {
			item = strings.TrimSpace(item)
			if item == "" {
				if i < len(items)-1 && strings.TrimSpace(p.data[list.key]) != "" {
					p.warnf("", list.key, "empty entry at position %d; remove the extra comma", i+1)
				}
				continue // a trailing comma is common in existing configs
			}
			platform, err := ParsePlatform(item)
			if err != nil {
				platform = Platform(item)
				switch {
				case list.strategy == StrategyLocal && localPlatformName.MatchString(item):
					p.warnf(platform, list.key, "%q is not os/arch; tasks must ask for exactly this name", item)
				default:
					p.platformErrorf(platform, list.key, "%v", err)
				}
			}
			if list.strategy != StrategyLocal {
				p.dynamicListed[platform.Label()] = dynamicEntry{platform: platform, pooled: list.strategy == StrategyDynamicPool}
			}
			if other, ok := p.listedIn[platform]; ok {
				if other == list.key {
					p.warnf(platform, list.key, "%s is listed twice", platform)
				} else {
					p.platformErrorf(platform, list.key, "%s is also in %s; a platform has one strategy: remove it from one list", platform, other)
				}
				continue
			}
			p.listedIn[platform] = list.key
			p.cfg.Platforms[platform] = list.strategy
		}
	}
}

// parseHosts reads the static hosts. A host with an error is left out; its platform is served
// by its other hosts, and is unusable only when none is left.
func (p *parser) parseHosts() {
	usable := map[Platform]int{}
	hostErrors := map[Platform]Problems{}
	for _, name := range slices.Sorted(maps.Keys(p.hostFields)) {
		fields := p.hostFields[name]
		h := &StaticHost{Name: name}
		platform, perr := ParsePlatform(fields["platform"])
		if perr == nil {
			h.Platform = platform
		}
		var errs Problems
		fail := func(field, format string, args ...any) {
			errs = append(errs, p.add(Error, h.Platform, hostKey(name, field), format+"; host %s is left out", append(args, name)...))
		}
		warn := func(field, format string, args ...any) { p.warnf(h.Platform, hostKey(name, field), format, args...) }
		if !validHostName(name) {
			fail("address", "host name %q cannot be used: it is written into the assigned-host label, so it must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", name)
		}
		p.checkFields(fields, hostKeys, nil, fail, warn)
		h.Address, h.User, h.Secret, h.HostKey = fields["address"], fields["user"], fields["secret"], fields["host-key"]

		if fields["platform"] != "" && perr != nil {
			fail("platform", "%v", perr)
		}
		if h.Address != "" {
			if err := checkAddress(h.Address); err != nil {
				fail("address", "%v", err)
			}
		}
		if perr == nil {
			if other, ok := p.listedIn[platform]; ok {
				fail("platform", "%s is in %s, so a static host for it would never be used; remove the host or the platform from %s", platform, other, other)
			}
		}
		h.Concurrency = 1
		if raw := fields["concurrency"]; raw != "" {
			h.Concurrency = p.intInRange(raw, 1, noUpperBound, "builds at once on this host", func(msg string) { fail("concurrency", "%s", msg) })
		} else {
			warn("concurrency", "not set; berth runs one build at a time on this host")
		}
		if h.HostKey != "" {
			if err := checkHostKey(h.HostKey); err != nil {
				fail("host-key", "%v", err)
			}
		}
		h.Limits = parseLimits(fields, fail)
		if perr == nil {
			if _, listed := p.listedIn[platform]; !listed {
				p.cfg.Platforms[platform] = StrategyStatic
			}
		}
		if len(errs) > 0 {
			p.cfg.leftOut[name] = errs
			hostErrors[h.Platform] = append(hostErrors[h.Platform], errs...)
			continue
		}
		usable[platform]++
		p.cfg.Hosts = append(p.cfg.Hosts, h)
	}
	for platform, errs := range hostErrors {
		if s := p.cfg.Platforms[platform]; s == StrategyStatic && usable[platform] == 0 {
			p.cfg.broken[platform] = append(p.cfg.broken[platform], errs...)
		}
	}
}

type dynamicEntry struct {
	platform Platform
	pooled   bool
}

// parseDynamic checks the settings of every platform in a dynamic list (also of one that is
// in two lists, so that all its mistakes are reported at once), and models those whose
// strategy is dynamic and whose settings are usable.
func (p *parser) parseDynamic() {
	for _, label := range slices.Sorted(maps.Keys(p.dynamicFields)) {
		if _, ok := p.dynamicListed[label]; !ok {
			p.warnf("", "dynamic."+label+".*", "no platform in dynamic-platforms or dynamic-pool-platforms has this name, so these keys are ignored; add the platform to a list to use them")
		}
	}
	for _, label := range slices.Sorted(maps.Keys(p.dynamicListed)) {
		platform, pooled := p.dynamicListed[label].platform, p.dynamicListed[label].pooled
		fields := p.dynamicFields[label]
		fail := func(field, format string, args ...any) {
			p.platformErrorf(platform, dynamicKey(platform, field), format, args...)
		}
		warn := func(field, format string, args ...any) {
			p.warnf(platform, dynamicKey(platform, field), format, args...)
		}
		if fields == nil {
			fail("type", "%s lists %s but there are no dynamic.%s.* settings, so tasks for it fail; set at least type, max-instances and ssh-secret, or remove it from the list", p.listedIn[platform], platform, label)
			continue
		}
		d := &DynamicPlatform{Platform: platform, Type: fields["type"], Settings: map[string]string{}}
		provider, known := providerKeys[d.Type]
		if d.Type != "" && !known {
			msg := fmt.Sprintf("unknown provider type %q; berth knows %s", d.Type, strings.Join(slices.Sorted(maps.Keys(providerKeys)), ", "))
			if s := suggest(d.Type, slices.Collect(maps.Keys(providerKeys))); s != "" {
				msg += "; did you mean " + s + "?"
			}
			fail("type", "%s", msg)
		}
		schema := maps.Clone(dynamicKeys)
		if pooled {
			maps.Copy(schema, poolKeys)
		} else {
			maps.Copy(schema, dynamicOnlyKeys)
		}
		maps.Copy(schema, provider)
		p.checkFields(fields, schema, func(field string) string { return p.misplacedField(field, d.Type, pooled) }, fail, warn)

		d.SSHSecret, d.InstanceTag, d.HostKey = fields["ssh-secret"], fields["instance-tag"], fields["host-key"]
		if raw, ok := fields["max-instances"]; ok {
			d.MaxInstances = p.intInRange(raw, 1, noUpperBound, "VMs at most", func(msg string) { fail("max-instances", "%s", msg) })
		}
		d.AllocationTimeout = p.seconds(fields, "allocation-timeout", DefaultAllocationTimeout, fail)
		d.CheckInterval = p.seconds(fields, "check-interval", DefaultCheckInterval, fail)
		if raw, ok := fields["min-idle"]; ok {
			d.MinIdle = p.intInRange(raw, 0, noUpperBound, "idle slots kept ready", func(msg string) { fail("min-idle", "%s", msg) })
		}
		if raw, ok := fields["max-age"]; ok && !pooled {
			d.MaxAge = time.Duration(p.intInRange(raw, 1, maxDurationMinute, "minutes a warm VM may wait", func(msg string) { fail("max-age", "%s", msg) })) * time.Minute
			if d.MinIdle == 0 {
				warn("max-age", "ignored: on a dynamic platform max-age bounds the life of warm VMs, and min-idle is not set; each VM serves one task and goes")
			}
		}
		if pooled {
			d.Pool = &Pool{}
			if raw, ok := fields["concurrency"]; ok {
				d.Pool.Concurrency = p.intInRange(raw, 1, noUpperBound, "builds at once on each VM", func(msg string) { fail("concurrency", "%s", msg) })
			}
			if raw, ok := fields["max-age"]; ok {
				d.Pool.MaxAge = time.Duration(p.intInRange(raw, 1, maxDurationMinute, "minutes a VM may live", func(msg string) { fail("max-age", "%s", msg) })) * time.Minute
			}
		}
		if raw := fields["sudo-commands"]; raw != "" {
			if sudo, err := ParseSudoCommands(raw); err != nil {
				fail("sudo-commands", "%v", err)
			} else {
				d.SudoCommands = sudo
			}
		}
		if d.HostKey != "" {
			if err := checkHostKey(d.HostKey); err != nil {
				fail("host-key", "%v", err)
			}
		}
		d.Limits = parseLimits(fields, fail)
		for field := range provider {
			if v, ok := fields[field]; ok {
				d.Settings[field] = v
			}
		}
		p.checkProvider(platform, d, provider, fail)
		if s := p.cfg.Platforms[platform]; (s == StrategyDynamic || s == StrategyDynamicPool) && len(p.cfg.broken[platform]) == 0 {
			p.cfg.Dynamic[platform] = d
		}
	}
}

// parseLimits reads a host's or platform's build limits, failing it on each bad key.
func parseLimits(fields map[string]string, fail func(field, format string, args ...any)) BuildLimits {
	limits, errs := ParseBuildLimits(fields)
	for _, err := range errs {
		var bad *LimitError
		if errors.As(err, &bad) {
			fail(bad.Key, "%s", bad.Reason)
		}
	}
	return limits
}

// ProviderCheck, when set, checks a dynamic platform's provider keys (its Settings) as the
// provider of its type does when berth builds it: gp3's volume limits, the shape of an AMI id
// or a CRN, and the like. Parse reports its error as the platform's, so a platform the
// provider would refuse is unusable at load, not at its first task. The berth binary sets it
// to cloud.Check (internal/controller/providers.go): this package knows no cloud. Set it
// before any Parse, never while one may run. A nil ProviderCheck checks nothing.
//
// The error should name the platform and then the key, as the providers' do ("setup: bad
// configuration: platform linux/arm64: throughput: 2000 MiB/s needs ..."): the problem is
// then that key's. A type the checker does not know is no error of it (Parse reports unknown
// types).
var ProviderCheck func(typ, platform string, settings map[string]string) error

// checkProvider asks ProviderCheck about d's provider keys. It does not ask when the type is
// unknown or when a provider key already has an error, so that one mistake makes one problem:
// the provider would only say again that a required key is missing or a bool is malformed.
func (p *parser) checkProvider(platform Platform, d *DynamicPlatform, keys map[string]field, fail func(field, format string, args ...any)) {
	if ProviderCheck == nil || keys == nil {
		return
	}
	for _, problem := range p.cfg.broken[platform] {
		for field := range keys {
			if problem.Key == dynamicKey(platform, field) {
				return
			}
		}
	}
	err := ProviderCheck(d.Type, string(platform), maps.Clone(d.Settings))
	if err == nil {
		return
	}
	field, msg := providerProblem(err, d.Type, keys)
	fail(field, "%s", msg)
}

// providerProblem is the key a provider's refusal is about and what it says of it: the key
// the error names (see keyedError), if it is one of the type's; else the type's, quoting the
// whole error.
func providerProblem(err error, typ string, keys map[string]field) (field, message string) {
	var keyed keyedError
	if errors.As(err, &keyed) {
		if _, ok := keys[keyed.ConfigKey()]; ok {
			return keyed.ConfigKey(), keyed.Reason()
		}
	}
	return "type", fmt.Sprintf("the %s provider refuses these settings: %v", typ, err)
}

// keyedError is a ProviderCheck error that names the key it refuses (cloud.BadKey's).
type keyedError interface {
	error
	ConfigKey() string
	Reason() string
}

// misplacedField explains a field that belongs somewhere else, or returns "". The
// multi-platform controller ignores such fields, so berth does too, with a warning.
func (p *parser) misplacedField(field, providerType string, pooled bool) string {
	if _, ok := poolKeys[field]; ok && !pooled {
		return "ignored: only platforms in dynamic-pool-platforms have " + field
	}
	for other, keys := range providerKeys {
		if _, ok := keys[field]; ok && other != providerType && providerType != "" {
			return fmt.Sprintf("ignored: %s is a setting of type %s, and this platform's type is %s", field, other, providerType)
		}
	}
	return ""
}

// checkFields reports unknown fields (warnings: berth ignores them), and missing fields and
// values of the wrong kind (errors). A required field that is missing because its name was
// mistyped says so.
func (p *parser) checkFields(fields map[string]string, schema map[string]field, misplaced func(string) string,
	fail, warn func(field, format string, args ...any)) {
	typoOf := map[string]string{} // required field → the unknown field that looks like it
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		f, ok := schema[name]
		if !ok {
			msg := ""
			if misplaced != nil {
				msg = misplaced(name)
			}
			if msg == "" {
				msg = "unknown key; berth ignores it"
				if s := suggest(name, slices.Collect(maps.Keys(schema))); s != "" {
					msg += "; did you mean " + s + "?"
					if _, set := fields[s]; !set && typoOf[s] == "" {
						typoOf[s] = name
					}
				}
			}
			warn(name, "%s", msg)
			continue
		}
		value := fields[name]
		switch {
		case value == "" && f.required:
			fail(name, "is empty; it is required")
		case f.kind == kindBool && value != "":
			if _, err := strconv.ParseBool(value); err != nil {
				fail(name, "%q is not true or false", value)
			}
		case f.kind == kindNumber && value != "":
			if v, err := strconv.ParseFloat(value, 64); err != nil || v <= 0 {
				fail(name, "%q is not a positive number", value)
			}
		case f.shape != nil && value != "" && !f.shape.MatchString(value):
			warn(name, "%q is not %s; berth passes it on as set, and %s: each task of this platform fails until it is fixed", value, f.shapeHelp, f.refusal)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(schema)) {
		if _, present := fields[name]; schema[name].required && !present {
			msg := "missing; it is required"
			if typo := typoOf[name]; typo != "" {
				msg += fmt.Sprintf(" (%s is set: did you mean %s?)", typo, name)
			}
			if h := schema[name].help; h != "" {
				msg += ": set it to " + h
			}
			fail(name, "%s", msg)
		}
	}
}

// intInRange parses a whole number in [lo, hi] (hi noUpperBound: lo or more); what says what
// the number counts.
func (p *parser) intInRange(raw string, lo, hi int, what string, fail func(string)) int {
	if raw == "" {
		return 0 // reported as empty by checkFields
	}
	span := fmt.Sprintf("from %d to %d", lo, hi)
	switch hi {
	case noUpperBound:
		span = fmt.Sprintf("%d or more", lo)
	case maxDurationMinute, maxDurationSecond:
		span += ", the longest time Go's time.Duration holds (about 292 years)"
	}
	n, err := strconv.Atoi(raw)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			fail(fmt.Sprintf("%s is out of range; the number of %s must be %s", raw, what, span))
		} else {
			fail(fmt.Sprintf("%q is not a whole number; write the number of %s, %s", raw, what, span))
		}
		return 0
	}
	if n < lo || n > hi {
		fail(fmt.Sprintf("%d is out of range; the number of %s must be %s", n, what, span))
		return 0
	}
	return n
}

func (p *parser) seconds(fields map[string]string, field string, def int, fail func(string, string, ...any)) time.Duration {
	raw := fields[field]
	if raw == "" { // absent or empty: the default
		return time.Duration(def) * time.Second
	}
	n := p.intInRange(raw, 1, maxDurationSecond, "seconds", func(msg string) { fail(field, "%s", msg) })
	return time.Duration(n) * time.Second
}

// hostNameRE is what a static host may be called: the name is the value of the contract's
// assigned-host label on the TaskRun, and a Kubernetes label value is at most 63 characters of
// these (the apiserver's own rule, k8s.io/apimachinery validation.IsValidLabelValue).
var hostNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

func validHostName(name string) bool { return hostNameRE.MatchString(name) }

// dnsNameRE is a DNS name as RFC 1123 allows it: labels of at most 63 characters.
var dnsNameRE = regexp.MustCompile(`^([a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([-a-zA-Z0-9]{0,61}[a-zA-Z0-9])?$`)

// checkAddress accepts an IP or DNS name, optionally with :port.
func checkAddress(addr string) error {
	host := addr
	if h, port, err := net.SplitHostPort(addr); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q has an invalid port", addr)
		}
		host = h
	}
	if net.ParseIP(host) != nil || (len(host) <= 253 && dnsNameRE.MatchString(host)) {
		return nil
	}
	return fmt.Errorf("%q is neither an IP address nor a DNS name", addr)
}

// checkHostKey accepts one public key in authorized_keys form: "<type> <base64>[ comment]".
func checkHostKey(key string) error {
	parts := strings.Fields(key)
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "ssh-") && !strings.HasPrefix(parts[0], "ecdsa-") {
		return fmt.Errorf("not a public key; paste one line as ssh-keyscan prints it, like \"ssh-ed25519 AAAA...\"")
	}
	return nil
}

// splitList splits a comma list, trimming spaces and dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
