package kueue

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/berth-ci/berth/internal/config"
)

// AWSIP is the resource tekton-kueue charges once per AWS platform a PipelineRun builds for:
// Konflux keeps it as a quota on the AWS VMs of a cluster in all.
const AWSIP = "aws-ip"

// notChargedAWSIP are the platforms tekton-kueue asks no aws-ip for: the list is written out
// in the CEL of every tekton-kueue config Konflux ships (deploy/kueue-*-tekton-kueue-config.yaml
// in ../shared/real: production, staging and development alike); every other platform is
// charged one, whatever serves it.
var notChargedAWSIP = []config.Platform{"linux/ppc64le", "linux/s390x", "linux/x86_64", "local", "localhost"}

// ChargesAWSIP says whether tekton-kueue asks an aws-ip for a PipelineRun building for p.
func ChargesAWSIP(p config.Platform) bool { return !slices.Contains(notChargedAWSIP, p) }

// otherResources are the resources of Konflux's ClusterQueues that count no platform: Kueue's
// own count of PipelineRuns and its pod resources, and tekton-kueue's own tokens (the
// resource() calls with a literal name in its CEL). They are listed, not compared.
var otherResources = []string{"tekton.dev/pipelineruns", "cpu", "memory", "pods", "ephemeral-storage",
	"konflux-ci-dev-token", "mintmaker", "konflux-release"}

// ResourceName is the Kueue resource tekton-kueue asks for a PipelineRun building for p: the
// platform with "/" and "_" written as "-" (its CEL: replace(replace(p, "/", "-"), "_", "-")),
// so linux/x86_64 is linux-x86-64.
func ResourceName(p config.Platform) string {
	return strings.NewReplacer("/", "-", "_", "-").Replace(string(p))
}

// Capacity is what the config gives one platform.
type Capacity struct {
	Platform config.Platform
	Strategy config.Strategy
	// Tasks is how many tasks it runs at once (config.PlatformReport.Capacity); a local
	// platform has no bound of berth's.
	Tasks  int
	Usable bool
	// Provider is the cloud of a dynamic platform (aws, ibmz, ibmp).
	Provider string
}

// Capacities is what cfg gives each of its platforms, sorted by platform.
func Capacities(cfg *config.Config) []Capacity {
	var out []Capacity
	for _, r := range cfg.Report() {
		c := Capacity{Platform: r.Platform, Strategy: r.Strategy, Tasks: r.Capacity, Usable: r.Usable}
		if d := cfg.Dynamic[r.Platform]; d != nil {
			c.Provider = d.Type
		}
		out = append(out, c)
	}
	return out
}

// Verdict is how a quota and a capacity compare.
type Verdict string

const (
	Agree Verdict = "agree"
	// QuotaAbove: Kueue admits more PipelineRuns than berth can serve at once; the rest of the
	// admitted tasks wait in berth's queue.
	QuotaAbove Verdict = "quota-above"
	// QuotaBelow: Kueue holds back PipelineRuns berth could serve: slots stay idle, VMs that
	// max-instances allows are never launched.
	QuotaBelow Verdict = "quota-below"
	// NoQuota: the config serves the platform, the ClusterQueue has no quota for its resource,
	// so Kueue never admits a PipelineRun that builds for it.
	NoQuota Verdict = "no-quota"
	// NoPlatform: a quota for a platform the config does not serve: Kueue admits its
	// PipelineRuns, berth fails their tasks.
	NoPlatform Verdict = "no-platform"
	// Local: berth runs a local platform's tasks on the cluster itself and bounds them by no
	// count; the quota alone does.
	Local Verdict = "local"
)

// Disagrees says whether the verdict is one the operator should act on.
func (v Verdict) Disagrees() bool { return v != Agree && v != Local }

// Row is one resource of the comparison.
type Row struct {
	Resource string
	// Platforms are those of the config tekton-kueue counts in Resource: one for a platform's
	// own resource (two spellings may share one), every AWS-charged one for aws-ip.
	Platforms []config.Platform
	// Quota is nil when the ClusterQueue has none for Resource.
	Quota *resource.Quantity
	// Capacity is how many tasks the config lets Platforms run at once; Unbounded when one of
	// them is local.
	Capacity  int
	Unbounded bool
	Verdict   Verdict
	// Cost says what the disagreement costs, for the operator.
	Cost string
}

// Report is a ClusterQueue held against a config.
type Report struct {
	Queue string
	// Rows are the platforms' resources sorted by name, then aws-ip.
	Rows []Row
	// Other are the queue's resources that count no platform, sorted: not compared.
	Other []string
	// Warnings are disagreements that belong to no one row's numbers: platforms charged an
	// aws-ip that no AWS VM serves, a cohort that lends beyond the nominal quotas.
	Warnings []string
}

// Disagreements counts the rows and warnings the operator should act on.
func (r Report) Disagreements() int {
	n := len(r.Warnings)
	for _, row := range r.Rows {
		if row.Verdict.Disagrees() {
			n++
		}
	}
	return n
}

// Compare holds the queue's quotas against the capacities the config gives.
func Compare(q ClusterQueue, caps []Capacity) Report {
	rep := Report{Queue: q.Name}
	byResource := map[string][]Capacity{}
	for _, c := range caps {
		name := ResourceName(c.Platform)
		byResource[name] = append(byResource[name], c)
	}
	names := map[string]bool{}
	for name := range byResource {
		names[name] = true
	}
	for name := range q.Quotas {
		if name != AWSIP && !slices.Contains(otherResources, name) {
			names[name] = true
		}
	}
	for _, name := range sortedKeys(names) {
		rep.Rows = append(rep.Rows, compareOne(name, byResource[name], q.Quotas))
	}
	rep.Rows = append(rep.Rows, compareAWSIP(caps, q.Quotas))
	for name := range q.Quotas {
		if slices.Contains(otherResources, name) {
			rep.Other = append(rep.Other, name)
		}
	}
	slices.Sort(rep.Other)
	for _, c := range caps {
		// A dynamic platform listed with no settings has no provider to tell; it is unusable,
		// which validate reports already.
		unknown := c.Provider == "" && (c.Strategy == config.StrategyDynamic || c.Strategy == config.StrategyDynamicPool)
		if ChargesAWSIP(c.Platform) && c.Provider != "aws" && !unknown {
			how := string(c.Strategy)
			if c.Provider != "" {
				how += " (" + c.Provider + ")"
			}
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s is %s in this config, yet tekton-kueue charges it an %s: each PipelineRun building for it holds one it does not use", c.Platform, how, AWSIP))
		}
	}
	if q.Cohort != "" {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("ClusterQueue %s is in cohort %s: it may borrow beyond the nominal quotas compared here", q.Name, q.Cohort))
	}
	return rep
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func compareOne(name string, caps []Capacity, quotas map[string]resource.Quantity) Row {
	row := Row{Resource: name}
	usable, static, pooled := false, false, false
	for _, c := range caps {
		row.Platforms = append(row.Platforms, c.Platform)
		row.Capacity += c.Tasks
		row.Unbounded = row.Unbounded || c.Strategy == config.StrategyLocal
		usable = usable || c.Usable
		static = static || c.Strategy == config.StrategyStatic
		pooled = pooled || c.Strategy == config.StrategyDynamicPool
	}
	if q, ok := quotas[name]; ok {
		row.Quota = &q
	}
	switch {
	case len(caps) == 0:
		row.Verdict, row.Cost = NoPlatform, fmt.Sprintf("the config serves no platform tekton-kueue counts as %s: Kueue admits up to %s such PipelineRuns, berth fails their tasks", name, row.Quota)
	case row.Quota == nil:
		row.Verdict, row.Cost = NoQuota, fmt.Sprintf("no quota: Kueue never admits a PipelineRun building for %s (resource %s unavailable in ClusterQueue)", joinPlatforms(row.Platforms), name)
		if !usable {
			row.Cost += "; berth could not serve it either: it is unusable in this config"
		}
	case row.Unbounded:
		row.Verdict, row.Cost = Local, "local: berth runs it on the cluster; the quota alone bounds it"
	default:
		row.Verdict, row.Cost = verdict(*row.Quota, row.Capacity)
		switch {
		case row.Verdict == QuotaAbove && !usable:
			row.Cost = fmt.Sprintf("unusable in this config: every task of the %s PipelineRun(s) Kueue admits at once fails", row.Quota)
		case row.Verdict == QuotaAbove:
			row.Cost = fmt.Sprintf("Kueue admits %s at once, berth runs %d: up to %s admitted task(s) wait in berth's queue", row.Quota, row.Capacity, difference(*row.Quota, row.Capacity))
		case row.Verdict == QuotaBelow && static:
			row.Cost = fmt.Sprintf("Kueue admits %s at once: %s slot(s) of its static hosts stay idle", row.Quota, difference(*row.Quota, row.Capacity))
		case row.Verdict == QuotaBelow && pooled:
			row.Cost = fmt.Sprintf("Kueue admits %s at once: %s slot(s) of its pooled VMs are never used", row.Quota, difference(*row.Quota, row.Capacity))
		case row.Verdict == QuotaBelow:
			row.Cost = fmt.Sprintf("Kueue admits %s at once: max-instances is never reached, %s VM(s) it allows are never launched", row.Quota, difference(*row.Quota, row.Capacity))
		}
	}
	return row
}

// compareAWSIP holds the aws-ip quota against the tasks the AWS-charged platforms can run at
// once: the quota below that sum holds back builds berth could run; above it, admitted tasks
// wait in berth. A local platform charged one bounds nothing of berth's and adds nothing.
func compareAWSIP(caps []Capacity, quotas map[string]resource.Quantity) Row {
	row := Row{Resource: AWSIP}
	allLocal := true
	for _, c := range caps {
		if !ChargesAWSIP(c.Platform) {
			continue
		}
		row.Platforms = append(row.Platforms, c.Platform)
		if c.Strategy != config.StrategyLocal {
			row.Capacity += c.Tasks
			allLocal = false
		}
	}
	if q, ok := quotas[AWSIP]; ok {
		row.Quota = &q
	}
	switch {
	case len(row.Platforms) == 0 && row.Quota == nil:
		row.Verdict, row.Cost = Agree, "no platform is charged one, and there is no quota"
	case len(row.Platforms) == 0:
		row.Verdict, row.Cost = NoPlatform, "no platform of the config is charged one: the quota is never used"
	case row.Quota == nil:
		row.Verdict, row.Cost = NoQuota, fmt.Sprintf("no quota: Kueue never admits a PipelineRun building for any of the %d platform(s) tekton-kueue charges one", len(row.Platforms))
	case allLocal:
		row.Unbounded = true
		row.Verdict, row.Cost = Local, "every platform charged one is local: berth bounds them by no count; the quota alone does"
	default:
		row.Verdict, row.Cost = verdict(*row.Quota, row.Capacity)
		switch row.Verdict {
		case QuotaAbove:
			row.Cost = fmt.Sprintf("Kueue admits %s AWS-charged builds at once, the config's platforms run %d: up to %s admitted task(s) wait in berth's queue", row.Quota, row.Capacity, difference(*row.Quota, row.Capacity))
		case QuotaBelow:
			row.Cost = fmt.Sprintf("Kueue admits %s AWS-charged builds at once, the config's platforms could run %d: their max-instances are never reached together", row.Quota, row.Capacity)
		}
	}
	return row
}

func verdict(quota resource.Quantity, capacity int) (Verdict, string) {
	switch quota.Cmp(*resource.NewQuantity(int64(capacity), resource.DecimalSI)) {
	case 1:
		return QuotaAbove, ""
	case -1:
		return QuotaBelow, ""
	}
	return Agree, "agree"
}

// difference is |quota − capacity| as a quantity, so that a fractional quota stays exact.
func difference(quota resource.Quantity, capacity int) string {
	d := quota.DeepCopy()
	d.Sub(*resource.NewQuantity(int64(capacity), resource.DecimalSI))
	if d.Sign() < 0 {
		d.Neg()
	}
	return d.String()
}

func joinPlatforms(ps []config.Platform) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ", ")
}
