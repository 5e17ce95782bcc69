// Package localaffinity pins the pod of a task on a local platform to cluster nodes of that
// platform's architecture and OS. A local platform builds where its pod runs, so a
// linux/arm64 build that lands on an amd64 node builds the wrong architecture. The admission
// webhook adds the requirement when a TaskRun is created (Require); the controller serves a
// local platform only to a TaskRun whose pod template carries it (Enforced). Both use this
// package, so what one adds is what the other checks.
package localaffinity

import (
	"slices"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// WebhookName is the name of the MutatingWebhookConfiguration that registers the webhook
// adding the requirement: the controller names it in the error a task without it gets.
const WebhookName = "webhook.platform-affinity.berth.dev"

// Node is what a platform asks of a node: the values of its kubernetes.io/os and
// kubernetes.io/arch labels.
type Node struct {
	OS   string
	Arch string
}

// archLabels are the architecture names tasks and configs use (uname -m's) whose node label
// (Go's GOARCH, which the kubelet writes) is spelled otherwise.
var archLabels = map[string]string{
	"x86_64":  "amd64",
	"aarch64": "arm64",
	"i386":    "386",
	"i686":    "386",
	"armv7l":  "arm",
}

// operatingSystems are the OS names a platform can pin: those the kubelet writes into
// kubernetes.io/os. A sized variant such as linux-mlarge names a VM size, not a node's OS.
var operatingSystems = []string{"linux", "windows", "darwin"}

// NodeOf is the node a platform named os/arch must run on. It is false for platforms that
// name no node: local and localhost (this cluster, any node), names that are not os/arch, an
// OS nodes do not report, and an architecture that is no valid label value.
func NodeOf(platform string) (Node, bool) {
	osName, arch, ok := strings.Cut(platform, "/")
	if !ok || !slices.Contains(operatingSystems, osName) {
		return Node{}, false
	}
	if mapped, ok := archLabels[arch]; ok {
		arch = mapped
	}
	if arch == "" || len(validation.IsValidLabelValue(arch)) > 0 {
		return Node{}, false
	}
	return Node{OS: osName, Arch: arch}, true
}

// Of is the node affinity of the TaskRun's pod template, nil if it has none.
func Of(tr *pipelinev1.TaskRun) *corev1.NodeAffinity {
	if pt := tr.Spec.PodTemplate; pt != nil && pt.Affinity != nil {
		return pt.Affinity.NodeAffinity
	}
	return nil
}

// Requirements are the node selector requirements that pin a pod to n.
func (n Node) Requirements() []corev1.NodeSelectorRequirement {
	return []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{n.Arch}},
		{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{n.OS}},
	}
}

// Require returns a copy of na whose required node selector terms all pin the pod to n. The
// terms are alternatives (a node matching any one will do), so the requirements join every
// existing term rather than standing beside them as one more; with no terms there is one made
// of them alone. Requirements within a term must all hold, so a term that allowed other
// architectures now allows only n's, and one that asked for another architecture matches no
// node: the pod may stay unscheduled, never run on the wrong architecture. Preferred terms are
// left as they are, and so is a term that pins the pod already.
func Require(na *corev1.NodeAffinity, n Node) *corev1.NodeAffinity {
	out := &corev1.NodeAffinity{}
	if na != nil {
		out = na.DeepCopy()
	}
	if out.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		out.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	terms := out.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		terms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range terms {
		for _, r := range n.Requirements() {
			if !pins(terms[i], r.Key, r.Values[0]) {
				terms[i].MatchExpressions = append(terms[i].MatchExpressions, r)
			}
		}
	}
	out.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = terms
	return out
}

// Enforced tells whether na keeps the pod on nodes of n: there is at least one required term,
// and every one holds an expression that allows n's architecture and OS and nothing else. A
// term that merely allows n's architecture among others would let the pod run on any of them.
func Enforced(na *corev1.NodeAffinity, n Node) bool {
	if na == nil || na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return false
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return false
	}
	for _, t := range terms {
		for _, r := range n.Requirements() {
			if !pins(t, r.Key, r.Values[0]) {
				return false
			}
		}
	}
	return true
}

// pins tells whether one of the term's expressions allows only value for key.
func pins(t corev1.NodeSelectorTerm, key, value string) bool {
	return slices.ContainsFunc(t.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool {
		return r.Key == key && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) > 0 &&
			!slices.ContainsFunc(r.Values, func(v string) bool { return v != value })
	})
}
