package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// logTailLines is how much of an install container's log the report shows: the end of an
// install log says why it stopped.
const logTailLines = 25

// Diagnose writes a report on why a cluster is not ready, for a person reading a TaskRun's
// log: the ClusterTemplateInstance's phase, message and conditions; its template and the
// space's quota; the Events of the space namespace (the instance's own first, each group in
// time order); and the install's Jobs and Pods with their containers' states and log tails.
// Where the pod log API cannot answer (no kubelet behind it), a terminated container's
// message stands in, and the report says so. It prints no Secret.
//
// What it cannot read is noted in the report and returned, joined, after the whole report is
// written.
func Diagnose(ctx context.Context, space *Space, name string, report io.Writer) error {
	d := diagnosis{ctx: ctx, space: space, name: name, w: report}
	inst, found := d.instance()
	d.template(inst, found)
	d.events(inst)
	d.install(inst)
	return errors.Join(d.errs...)
}

type diagnosis struct {
	ctx   context.Context
	space *Space
	name  string
	w     io.Writer
	errs  []error
}

func (d *diagnosis) printf(format string, args ...any) { fmt.Fprintf(d.w, format, args...) }

// failed notes a read that failed, in the report and in the returned error.
func (d *diagnosis) failed(what string, err error) {
	d.printf("  cannot read %s: %v\n", what, err)
	d.errs = append(d.errs, fmt.Errorf("reading %s: %w", what, err))
}

func (d *diagnosis) instance() (Instance, bool) {
	ref := fmt.Sprintf("ClusterTemplateInstance %s/%s", d.space.Namespace, d.name)
	d.printf("== %s\n", ref)
	inst, err := getInstance(d.ctx, d.space, d.name)
	if apierrors.IsNotFound(err) {
		d.printf("  does not exist: it was never created or has been deleted\n")
		return Instance{Namespace: d.space.Namespace, Name: d.name}, false
	}
	if err != nil {
		d.failed(ref, err)
		return Instance{Namespace: d.space.Namespace, Name: d.name}, false
	}
	d.printf("  template:   %s\n", inst.Template)
	d.printf("  parameters: %s\n", describeParameters(inst.Parameters))
	d.printf("  phase:      %s\n", orNone(inst.Phase))
	d.printf("  message:    %s\n", orNone(inst.Message))
	if inst.APIServerURL != "" {
		d.printf("  API URL:    %s\n", inst.APIServerURL)
	}
	if why := inst.Failure(); why != "" {
		d.printf("  failed:     %s\n", why)
	}
	if len(inst.Conditions) > 0 {
		d.printf("  conditions:\n")
	}
	for _, c := range inst.Conditions {
		d.printf("    %-18s %-7s %s%s (since %s)\n", c.Type, c.Status, c.Reason, messageSuffix(c.Message), clock(c.LastTransitionTime.Time))
	}
	return inst, true
}

func (d *diagnosis) template(inst Instance, found bool) {
	if !found {
		return
	}
	d.printf("== ClusterTemplate %s and the space's quota\n", inst.Template)
	costs := templateCosts{space: d.space, known: map[string]int64{}}
	switch cost, known, err := costs.of(d.ctx, inst.Template); {
	case err != nil:
		d.printf("  %v\n", err)
	case known:
		d.printf("  cost: %d\n", cost)
	default:
		d.printf("  cost: unknown (the space may not read ClusterTemplates)\n")
	}
	quotas := newList(quotaGVK)
	if err := d.space.Client.List(d.ctx, quotas, client.InNamespace(d.space.Namespace)); err != nil {
		if unreadable(err) {
			d.printf("  quota: unknown (the space may not read ClusterTemplateQuotas: %v)\n", err)
			return
		}
		d.failed("the ClusterTemplateQuotas", err)
		return
	}
	if len(quotas.Items) == 0 {
		d.printf("  quota: none in namespace %s\n", d.space.Namespace)
		return
	}
	use, useErr := currentUse(d.ctx, d.space, &costs)
	if useErr != nil {
		d.failed("the ClusterTemplateInstances", useErr)
	}
	for i := range quotas.Items {
		q, err := decode[quotaView](&quotas.Items[i])
		if err != nil {
			d.failed("a ClusterTemplateQuota", err)
			continue
		}
		d.printf("  ClusterTemplateQuota %s:\n", q.Name)
		allowed := false
		for _, a := range q.Spec.AllowedTemplates {
			limit := "no count limit"
			if a.Count > 0 {
				limit = fmt.Sprintf("at most %d", a.Count)
			}
			inUse := fmt.Sprintf("%d per the quota's status", statusCount(q, a.Name))
			if useErr == nil {
				inUse = "none in use"
				if n := use.count(a.Name); n > 0 {
					inUse = fmt.Sprintf("%d in use: %s", n, strings.Join(use.names[a.Name], ", "))
				}
			}
			d.printf("    allows %s (%s; %s)\n", a.Name, limit, inUse)
			allowed = allowed || a.Name == inst.Template
		}
		if !allowed {
			d.printf("    does NOT allow template %s\n", inst.Template)
		}
		if q.Spec.Budget > 0 {
			spent := fmt.Sprintf("%d spent per the quota's status", q.Status.BudgetSpent)
			if useErr == nil && use.spentKnown {
				spent = fmt.Sprintf("%d spent by the instances that exist", use.spent)
			}
			d.printf("    budget %d, %s\n", q.Spec.Budget, spent)
		}
	}
}

func (d *diagnosis) events(inst Instance) {
	d.printf("== Events in namespace %s (the cluster's first, oldest first)\n", d.space.Namespace)
	var list corev1.EventList
	if err := d.space.Client.List(d.ctx, &list, client.InNamespace(d.space.Namespace)); err != nil {
		d.failed("the Events", err)
		return
	}
	if len(list.Items) == 0 {
		d.printf("  none\n")
		return
	}
	own := func(e corev1.Event) bool {
		return e.InvolvedObject.Kind == instanceGVK.Kind && e.InvolvedObject.Name == inst.Name
	}
	slices.SortStableFunc(list.Items, func(a, b corev1.Event) int {
		if own(a) != own(b) {
			if own(a) {
				return -1
			}
			return 1
		}
		return eventTime(a).Compare(eventTime(b))
	})
	for _, e := range list.Items {
		count := ""
		if e.Count > 1 {
			count = fmt.Sprintf(" (x%d)", e.Count)
		}
		d.printf("  %s %-7s %s %s/%s: %s%s\n", clock(eventTime(e)), e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, strings.TrimSpace(e.Message), count)
	}
}

func eventTime(e corev1.Event) time.Time {
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return e.CreationTimestamp.Time
}

// install reports the Jobs and Pods that install the cluster: the Job <instance>-install
// (or any Job named after the instance or owned by it) and the Pods of those Jobs.
func (d *diagnosis) install(inst Instance) {
	d.printf("== Install Jobs and Pods of %s\n", inst.Name)
	prefix := inst.Name + "-"
	var jobs batchv1.JobList
	if err := d.space.Client.List(d.ctx, &jobs, client.InNamespace(d.space.Namespace)); err != nil {
		d.failed("the Jobs", err)
	}
	ours := map[types.UID]bool{}
	jobNames := map[string]bool{}
	for _, j := range jobs.Items {
		if !strings.HasPrefix(j.Name, prefix) && !ownedByKind(j.OwnerReferences, instanceGVK.Kind, inst.Name) {
			continue
		}
		ours[j.UID], jobNames[j.Name] = true, true
		d.printf("  Job %s: %d active, %d succeeded, %d failed\n", j.Name, j.Status.Active, j.Status.Succeeded, j.Status.Failed)
		for _, c := range j.Status.Conditions {
			if c.Status == corev1.ConditionTrue {
				d.printf("    %s (%s)%s\n", c.Type, c.Reason, messageSuffix(c.Message))
			}
		}
	}
	var pods corev1.PodList
	if err := d.space.Client.List(d.ctx, &pods, client.InNamespace(d.space.Namespace)); err != nil {
		d.failed("the Pods", err)
	}
	shown := len(jobNames)
	for i := range pods.Items {
		p := &pods.Items[i]
		if !strings.HasPrefix(p.Name, prefix) && !jobNames[p.Labels[batchv1.JobNameLabel]] && !jobNames[p.Labels["job-name"]] && !ownedByUID(p.OwnerReferences, ours) {
			continue
		}
		shown++
		d.pod(p)
	}
	if shown == 0 {
		d.printf("  none\n")
	}
}

func (d *diagnosis) pod(p *corev1.Pod) {
	d.printf("  Pod %s: %s%s\n", p.Name, orNone(string(p.Status.Phase)), reasonSuffix(p.Status.Reason, p.Status.Message))
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		switch s := cs.State; {
		case s.Terminated != nil:
			d.printf("    container %s: terminated with exit code %d%s at %s\n", cs.Name, s.Terminated.ExitCode,
				reasonSuffix(s.Terminated.Reason, ""), clock(s.Terminated.FinishedAt.Time))
		case s.Running != nil:
			d.printf("    container %s: running since %s\n", cs.Name, clock(s.Running.StartedAt.Time))
		case s.Waiting != nil:
			d.printf("    container %s: waiting%s\n", cs.Name, reasonSuffix(s.Waiting.Reason, s.Waiting.Message))
			continue // nothing has run, so there is no log
		default:
			continue
		}
		d.logTail(p, cs)
	}
}

// logTail shows the end of a container's log or, when the log API has none to give (no kubelet
// behind it, or a pod never placed on a node), the message the container left in its
// terminated state.
func (d *diagnosis) logTail(p *corev1.Pod, cs corev1.ContainerStatus) {
	tail := int64(logTailLines)
	limit := int64(64 << 10)
	raw, err := d.space.pods.Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, TailLines: &tail, LimitBytes: &limit}).DoRaw(d.ctx)
	if err == nil && strings.TrimSpace(string(raw)) != "" {
		d.printf("      log (last %d lines):\n", logTailLines)
		d.quote(string(raw))
		return
	}
	why := "the pod log API returned nothing"
	if err != nil {
		why = "the pod log API answered: " + oneLine(err)
	}
	t := cs.State.Terminated
	if t == nil || strings.TrimSpace(t.Message) == "" {
		d.printf("      log: unavailable (%s), and the container left no termination message\n", why)
		return
	}
	d.printf("      log: unavailable (%s); the container's termination message instead:\n", why)
	d.quote(t.Message)
}

func (d *diagnosis) quote(text string) {
	text = strings.TrimRight(text, "\n")
	if text == "" {
		d.printf("        (empty)\n")
		return
	}
	for _, line := range strings.Split(text, "\n") {
		d.printf("        | %s\n", line)
	}
}

func ownedByKind(refs []metav1.OwnerReference, kind, name string) bool {
	for _, r := range refs {
		if r.Kind == kind && r.Name == name {
			return true
		}
	}
	return false
}

func ownedByUID(refs []metav1.OwnerReference, uids map[types.UID]bool) bool {
	for _, r := range refs {
		if uids[r.UID] {
			return true
		}
	}
	return false
}

func reasonSuffix(reason, message string) string {
	s := ""
	if reason != "" {
		s = " (" + reason + ")"
	}
	return s + messageSuffix(message)
}

func clock(t time.Time) string {
	if t.IsZero() {
		return "--:--:--Z"
	}
	return t.UTC().Format("15:04:05Z")
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
