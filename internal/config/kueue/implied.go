package kueue

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/berth-ci/berth/internal/config"
)

// ImpliedQuota is the quota of one resource that matches the config: Kueue then admits as
// many PipelineRuns as berth runs tasks at once, no more and no fewer.
type ImpliedQuota struct {
	Resource  string
	Quota     resource.Quantity
	Platforms []config.Platform
}

// Implied are the quotas the config implies, by resource name, then aws-ip when a platform is
// charged one. A local platform has no count of berth's: localQuota stands for it, since
// without any quota Kueue would never admit its PipelineRuns.
func Implied(caps []Capacity, localQuota resource.Quantity) []ImpliedQuota {
	byResource := map[string][]Capacity{}
	awsIP := ImpliedQuota{Resource: AWSIP}
	for _, c := range caps {
		byResource[ResourceName(c.Platform)] = append(byResource[ResourceName(c.Platform)], c)
		if ChargesAWSIP(c.Platform) {
			awsIP.Platforms = append(awsIP.Platforms, c.Platform)
			if c.Strategy != config.StrategyLocal {
				awsIP.Quota.Add(*resource.NewQuantity(int64(c.Tasks), resource.DecimalSI))
			}
		}
	}
	var out []ImpliedQuota
	for _, name := range slices.Sorted(maps.Keys(byResource)) {
		q := ImpliedQuota{Resource: name}
		local := false
		for _, c := range byResource[name] {
			q.Platforms = append(q.Platforms, c.Platform)
			q.Quota.Add(*resource.NewQuantity(int64(c.Tasks), resource.DecimalSI))
			local = local || c.Strategy == config.StrategyLocal
		}
		if local {
			q.Quota = localQuota.DeepCopy()
		}
		out = append(out, q)
	}
	if len(awsIP.Platforms) > 0 {
		out = append(out, awsIP)
	}
	return out
}

// groupSize is how many resources each printed resource group covers. Kueue's current API
// takes up to 64 per group (coveredResources MaxItems in its v1beta1 and v1beta2 types); the
// ClusterQueues Konflux runs keep at most 16 per group, and a snippet in their shape merges
// into them as it is.
const groupSize = 16

// WriteResourceGroups prints the platform quotas as spec.resourceGroups entries of a
// ClusterQueue, groupSize resources per group, each group with its own flavor
// (flavorPrefix1, flavorPrefix2, ...: Kueue lets a flavor serve only one group). The aws-ip
// quota is printed as a comment: in Konflux's queues it shares a group with resources berth
// knows nothing of (cpu, memory, PipelineRun tokens), so the operator sets it there.
func WriteResourceGroups(w io.Writer, quotas []ImpliedQuota, source, flavorPrefix string) error {
	var platforms []ImpliedQuota
	var awsIP *ImpliedQuota
	for i := range quotas {
		if quotas[i].Resource == AWSIP {
			awsIP = &quotas[i]
		} else {
			platforms = append(platforms, quotas[i])
		}
	}
	ew := &errWriter{w: w}
	ew.printf("# Kueue quotas that match %s: one unit per task a platform runs at once.\n", source)
	ew.printf("# Printed by berth config kueue-quotas: merge into spec.resourceGroups of the ClusterQueue tekton-kueue admits into.\n")
	ew.printf("resourceGroups:\n")
	for start, n := 0, 1; start < len(platforms); start, n = start+groupSize, n+1 {
		group := platforms[start:min(start+groupSize, len(platforms))]
		ew.printf("- coveredResources:\n")
		for _, q := range group {
			ew.printf("  - %s\n", q.Resource)
		}
		ew.printf("  flavors:\n  - name: %s%d\n    resources:\n", flavorPrefix, n)
		for _, q := range group {
			ew.printf("    - name: %s\n      nominalQuota: %s\n", q.Resource, strconv.Quote(q.Quota.String()))
		}
	}
	if awsIP != nil {
		ew.printf("# %s: %s, the tasks the %d platform(s) tekton-kueue charges one can run at once;\n", AWSIP, strconv.Quote(awsIP.Quota.String()), len(awsIP.Platforms))
		ew.printf("# set it in the group that covers %s (beside cpu, memory and the PipelineRun tokens).\n", AWSIP)
	}
	return ew.err
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
