package caasstandin

import (
	"fmt"
	"sort"
	"strings"
)

// quotaRefusal decides, as the real operator's admission webhook does, whether a new instance of
// template may be created in namespace: "" if it may, else why not, naming the template and the
// quota. Without a quota in the namespace anything goes. With quotas, the template must be
// allowed by one of them, within its count of instances, and the cost of the new instance must
// fit every quota's budget, where a quota's spending is the cost of the instances of the
// templates it allows. costs holds the cost of each template that exists; existing the template
// of each instance already in the namespace (deleting ones included: they still run).
func quotaRefusal(namespace, template string, costs map[string]int64, quotas []quota, existing []string) string {
	if len(quotas) == 0 {
		return ""
	}
	sort.Slice(quotas, func(i, j int) bool { return quotas[i].Name < quotas[j].Name })
	instances := map[string]int64{}
	for _, t := range existing {
		instances[t]++
	}
	var allowedBy, names []string
	for _, q := range quotas {
		names = append(names, fmt.Sprintf("%q", q.Name))
		var spent int64
		for _, allowed := range q.Spec.AllowedTemplates {
			spent += instances[allowed.Name] * costs[allowed.Name]
		}
		if cost := costs[template]; q.Spec.Budget > 0 && spent+cost > q.Spec.Budget {
			return fmt.Sprintf("failed quota: cluster template %q costs %d, and ClusterTemplateQuota %q in namespace %s has %d of its budget of %d left",
				template, cost, q.Name, namespace, q.Spec.Budget-spent, q.Spec.Budget)
		}
		for _, allowed := range q.Spec.AllowedTemplates {
			if allowed.Name != template {
				continue
			}
			allowedBy = append(allowedBy, q.Name)
			if allowed.Count > 0 && instances[template] >= allowed.Count {
				return fmt.Sprintf("failed quota: ClusterTemplateQuota %q allows %d instance(s) of cluster template %q and namespace %s has %d",
					q.Name, allowed.Count, template, namespace, instances[template])
			}
		}
	}
	if len(allowedBy) == 0 {
		return fmt.Sprintf("failed quota: cluster template %q is not among the allowed templates of ClusterTemplateQuota %s in namespace %s",
			template, strings.Join(names, ", "), namespace)
	}
	return ""
}
