package bench

import (
	"strings"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/berth-ci/berth/internal/contract"
)

// Where the controller's writes go, from kube-apiserver's audit log of the controller's own
// user (the bench gives it a client certificate of its own): every create, update, patch,
// delete and deletecollection it sent, answered or refused, with its resource, namespace,
// name and time. A write belongs to a task when the object it names is the task's: the
// TaskRun itself, its secret multi-platform-ssh-<task>, an object named by the TaskRun's UID
// (berth's Allocation records), an internal TaskRun labelled with the task's name (provision,
// clean), or an Event about any of those (an Event's name is its object's name, a dot and a
// timestamp). Everything else (config, leases, BuildHost records, host checks) belongs to no
// task.

// KindWrites counts the controller's writes of one kind (resource and verb).
type KindWrites struct {
	// Total is every write of the kind in the measured part.
	Total int `json:"total"`
	// NoWaitTasks and WaitedTasks are the writes that belong to the measured tasks that
	// finished, apart for those that never waited and those that did.
	NoWaitTasks int `json:"noWaitTasks"`
	WaitedTasks int `json:"waitedTasks"`
	// OutsideTasks is the writes of the measured part that belong to no task.
	OutsideTasks int `json:"outsideTasks"`
}

// owners maps the names of objects to the task they belong to.
type owners map[string]string

// add records that the object called name belongs to task.
func (o owners) add(name, task string) { o[name] = task }

// addTask records a task, its secret and its UID.
func (o owners) addTask(task, uid string) {
	o[task] = task
	o[contract.SecretPrefix+task] = task
	if uid != "" {
		o[uid] = task
	}
}

// taskOf names the task a write belongs to, "" for none.
func (o owners) taskOf(ref *auditv1.ObjectReference) string {
	if ref == nil || ref.Name == "" {
		return ""
	}
	if task, ok := o[ref.Name]; ok {
		return task
	}
	if ref.Resource == "events" {
		if i := strings.LastIndexByte(ref.Name, '.'); i > 0 {
			return o[ref.Name[:i]]
		}
	}
	return ""
}

// kindOf is a write's resource (with its API group and subresource) and verb, e.g.
// "taskruns.tekton.dev patch", "secrets create", "events.events.k8s.io create".
func kindOf(ev *auditv1.Event) string {
	if ev.ObjectRef == nil {
		return ev.RequestURI + " " + ev.Verb
	}
	r := ev.ObjectRef.Resource
	if ev.ObjectRef.APIGroup != "" {
		r += "." + ev.ObjectRef.APIGroup
	}
	if ev.ObjectRef.Subresource != "" {
		r += "/" + ev.ObjectRef.Subresource
	}
	return r + " " + ev.Verb
}

// writeTally adds up the controller's writes as the audit log is read.
type writeTally struct {
	owners owners
	// from is when the measured part began; writes sent earlier count only for their task.
	from time.Time
	// waited tells, for each measured task that finished, whether it ever waited; tasks
	// not in it (the warm-up, unfinished ones) count only in the totals.
	waited map[string]bool

	byKind  map[string]*KindWrites
	perTask map[string]int
	total   int
	outside int
	events  int
	// serverTimes is how long the apiserver took over each write of the measured part.
	serverTimes []time.Duration
}

func newWriteTally(o owners, from time.Time, waited map[string]bool) *writeTally {
	return &writeTally{owners: o, from: from, waited: waited, byKind: map[string]*KindWrites{}, perTask: map[string]int{}}
}

func (w *writeTally) add(ev *auditv1.Event) {
	at := ev.RequestReceivedTimestamp.Time
	kind := kindOf(ev)
	k := w.byKind[kind]
	if k == nil {
		k = &KindWrites{}
		w.byKind[kind] = k
	}
	task := w.owners.taskOf(ev.ObjectRef)
	if waited, measured := w.waited[task]; measured {
		w.perTask[task]++
		if waited {
			k.WaitedTasks++
		} else {
			k.NoWaitTasks++
		}
	}
	if at.Before(w.from) {
		return
	}
	w.total++
	k.Total++
	if done := ev.StageTimestamp.Time; ev.Stage == auditv1.StageResponseComplete && !done.Before(at) {
		w.serverTimes = append(w.serverTimes, done.Sub(at))
	}
	if task == "" {
		w.outside++
		k.OutsideTasks++
	}
	if ev.ObjectRef != nil && ev.ObjectRef.Resource == "events" {
		w.events++
	}
}

// perTaskAverages are the mean writes of the tasks that never waited and of those that did
// (0 for a group without tasks), and how many waited.
func (w *writeTally) perTaskAverages() (noWait, waited float64, nWaited int) {
	var sumNo, sumWaited, nNo int
	for task, didWait := range w.waited {
		if didWait {
			sumWaited += w.perTask[task]
			nWaited++
		} else {
			sumNo += w.perTask[task]
			nNo++
		}
	}
	return mean(sumNo, nNo), mean(sumWaited, nWaited), nWaited
}

// kinds is a copy of the counts by kind, without kinds that have none in the measured part
// nor for any measured task.
func (w *writeTally) kinds() map[string]KindWrites {
	out := make(map[string]KindWrites, len(w.byKind))
	for kind, k := range w.byKind {
		if *k != (KindWrites{}) {
			out[kind] = *k
		}
	}
	return out
}

func mean(sum, n int) float64 {
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n)
}
