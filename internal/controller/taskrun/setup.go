package taskrun

import (
	"context"
	"strings"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/allocation"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/provision"
)

// init fills in the defaults, makes the parts the phases share and has the capacity follow the
// config's hosts and caps: what the reconciler needs before its first Reconcile, with or
// without a manager.
func (r *Reconciler) init() {
	if r.now == nil {
		r.now = time.Now
	}
	if r.MirrorRevertInterval == 0 {
		r.MirrorRevertInterval = time.Minute
	}
	if r.PositionInterval == 0 {
		r.PositionInterval = DefaultPositionInterval
	}
	if r.echoes == nil {
		// Every write of the parts below is noted, so its echo starts no reconcile.
		r.echoes = &echoes{namespace: r.Namespace}
		r.Client = r.echoes.noting(r.Client)
	}
	r.mirror = newMirror(r)
	r.secrets = &taskSecrets{client: r.Client, apiReader: r.APIReader, recorder: r.Recorder, mirror: r.mirror}
	r.records = &recordStore{client: r.Client, namespace: r.Namespace}
	r.strategies = strategies{config: r.Config, vms: r.Hosts}
	r.debts = &debts{client: r.Client, namespace: r.Namespace, provisioner: r.Provisioner, capacity: r.Capacity,
		strategies: r.strategies, records: r.records, cleans: r.Hosts, recorder: r.Recorder, now: r.now}
	r.keyring = &keyring{config: r.Config, newKey: r.NewKey, otp: r.OTP, secrets: r.secrets}
	r.gate = gate{namespace: r.Namespace, config: r.Config, strategies: r.strategies}
	if r.UpstreamNamespace == "" {
		r.UpstreamNamespace = DefaultUpstreamNamespace
	}
	users, _ := r.Provisioner.(provision.UserLister)
	r.line = &line{client: r.Client, apiReader: r.APIReader, namespace: r.Namespace, config: r.Config,
		capacity: r.Capacity, gate: r.gate, secrets: r.secrets, records: r.records, mirror: r.mirror,
		recorder: r.Recorder, now: r.now, started: r.now(), upstreamNamespace: r.UpstreamNamespace, users: users}
	r.retrying = &retryPhase{records: r.records, recorder: r.Recorder, oneTime: r.OTP != nil}
	r.answers = &answers{secrets: r.secrets, records: r.records, debts: r.debts}
	r.guarding = &guardPhase{apiReader: r.APIReader, secrets: r.secrets, records: r.records, keyring: r.keyring,
		mirror: r.mirror, recorder: r.Recorder}
	r.reserving = &reservePhase{capacity: r.Capacity, strategies: r.strategies, keyring: r.keyring, records: r.records,
		mirror: r.mirror, recorder: r.Recorder, now: r.now, waitTimeout: r.WaitTimeout, answers: r.answers}
	r.provisioning = &provisionPhase{provisioner: r.Provisioner, config: r.Config, keyring: r.keyring, records: r.records,
		secrets: r.secrets, capacity: r.Capacity, debts: r.debts, apiReader: r.APIReader, namespace: r.Namespace,
		recorder: r.Recorder, now: r.now, reserving: r.reserving, guarding: r.guarding}
	r.reserving.provisioning = r.provisioning
	r.admitting = &admitPhase{gate: r.gate, config: r.Config, line: r.line, secrets: r.secrets, mirror: r.mirror,
		records: r.records, reserving: r.reserving}
	r.finishing = &finishPhase{capacity: r.Capacity, keyring: r.keyring, secrets: r.secrets, mirror: r.mirror,
		debts: r.debts, now: r.now}
	r.Config.OnChange(func(cfg *config.Config) {
		r.Capacity.SetHosts(ledgerHosts(cfg))
		r.Capacity.SetNamespaceCaps(namespaceCaps(cfg))
	})
	if cfg := r.Config.Config(); cfg != nil {
		r.Capacity.SetHosts(ledgerHosts(cfg))
		r.Capacity.SetNamespaceCaps(namespaceCaps(cfg))
	}
}

// SetupWithManager registers the reconciler: user TaskRuns, secrets berth made (mapped to their
// TaskRun), records (mapped to their TaskRun's name), and wake-ups; and the restore of the ledger.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	r.init()
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &berthv1.Allocation{}, taskRunKeyField, indexTaskRunKey); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &pipelinev1.TaskRun{}, userTaskField, r.gate.indexUserTasks); err != nil {
		return err
	}
	notEchoes := r.echoes.notEchoes()
	err := ctrl.NewControllerManagedBy(mgr).
		Named("taskrun").
		For(&pipelinev1.TaskRun{}, builder.WithPredicates(r.reconcileTaskRunEvents()...)).
		Watches(&pipelinev1.TaskRun{}, r.firstLook(), builder.WithPredicates(notEchoes, r.userTaskEvents())).
		Watches(&pipelinev1.TaskRun{}, handler.EnqueueRequestsFromMapFunc(r.userTaskOfInternal)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(taskRunOfSecret), builder.WithPredicates(notEchoes)).
		Watches(&berthv1.Allocation{}, r.recordEvents(), builder.WithPredicates(notEchoes)).
		WatchesRawSource(r.Capacity.Source(handOverPriority)).
		WatchesRawSource(r.Capacity.JobEnds(jobEndPriority)).
		WatchesRawSource(source.Channel(r.mirror.refreshes, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(r)
	if err != nil {
		return err
	}
	if err := mgr.Add(PositionRefresh{mirror: r.mirror}); err != nil {
		return err
	}
	return mgr.Add(restorer{line: r.line})
}

// reconcileTaskRunEvents are the filters of the reconcile's own watch of TaskRuns, in order:
// every event first lets the mirror drop what berth's patch left once the cache has it
// (caughtUp); the echo of berth's own write goes no further (echoes), nor does the event of a
// TaskRun that is none of berth's business (userTaskEvents).
func (r *Reconciler) reconcileTaskRunEvents() []predicate.Predicate {
	return []predicate.Predicate{r.mirror.caughtUp(), r.echoes.notEchoes(), r.userTaskEvents()}
}

// userTaskEvents passes the events of every TaskRun but those classify calls unrelated.
func (r *Reconciler) userTaskEvents() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		return r.gate.classify(o.(*pipelinev1.TaskRun)) != unrelated
	})
}

// restorer rebuilds the ledger from the records as soon as the config is read, whether or not
// a TaskRun is there to be reconciled: the hosts' owner waits for it too (capacity.Restored).
type restorer struct{ line *line }

// NeedLeaderElection: the ledger a leader decides from is the one to rebuild.
func (rs restorer) NeedLeaderElection() bool { return true }

// Start tries the restore until it is done (it waits for the config) or ctx ends.
func (rs restorer) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("restore")
	for {
		done, err := rs.line.restoreOnce(ctx)
		if err != nil && ctx.Err() == nil {
			log.Error(err, "restoring the ledger from the records")
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// handOverPriority is the place in the work queue of what passes a slot on: a task that ended
// (its user removed, its slot freed) and a wake-up (a slot freed, a host job ended, a task that
// can go now). It goes before labelling arrivals that only join the line: behind a burst of
// thousands of those, a freed slot would otherwise sit idle for as long as labelling them
// takes. No arrival loses its turn by it, since each joins the ledger's line the moment the
// watch shows it (joinLine).
const handOverPriority = 10

// jobEndPriority is the place in the work queue of a host job's end: a build user made, whose
// secret is to be handed over, or removed, whose slot is to be freed. It goes before everything
// else, hand-overs included: under a burst of arrivals that each get a free slot (and so
// handOverPriority), a task whose user is ready would otherwise wait behind all of them for
// the one write that finishes it, and its slot and its place in berth's memory with it.
const jobEndPriority = 20

// addFirst queues the reconcile of the object's name with handOverPriority.
func addFirst(q workqueue.TypedRateLimitingInterface[reconcile.Request], o client.Object) {
	capacity.AddAt(q, client.ObjectKeyFromObject(o), handOverPriority)
}

// ended tells a TaskRun whose end frees what it held: finished, or being deleted.
func ended(tr *pipelinev1.TaskRun) bool { return tr.IsDone() || tr.DeletionTimestamp != nil }

// firstLook sees a user TaskRun's event before any reconcile: one that ended or went is queued
// first (its end frees a slot); any other joins its line (joinLine), and goes first when a
// slot is free for it.
func (r *Reconciler) firstLook() handler.EventHandler {
	look := func(ctx context.Context, old, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		tr, ok := o.(*pipelinev1.TaskRun)
		switch {
		case !ok:
		case ended(tr):
			// Once, as it ends: later events of an ended TaskRun (berth's own patch taking its
			// finalizer off) go in line with the rest.
			if was, ok := old.(*pipelinev1.TaskRun); !ok || !ended(was) {
				addFirst(q, tr)
			}
		case r.line.join(ctx, tr):
			addFirst(q, tr) // a slot is free for it
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			// Not what a start finds (thousands of TaskRuns long ended, maybe): restoreQueue
			// rebuilds the line, and controller-runtime queues those after everything else.
			if !e.IsInInitialList {
				look(ctx, nil, e.Object, q)
			}
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			look(ctx, e.ObjectOld, e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.mirror.forget(e.Object.GetUID()) // gone: nothing is ever written on it again
			addFirst(q, e.Object)
		},
	}
}

// userTaskOfInternal wakes the user TaskRun an internal TaskRun (--provisioner=taskrun) works
// for. Only berth's own namespace holds internal TaskRuns; the labels elsewhere mean nothing.
func (r *Reconciler) userTaskOfInternal(_ context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() != r.Namespace {
		return nil
	}
	key := provision.InternalOwner(o.(*pipelinev1.TaskRun))
	ns, name, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}

// recordEvents wakes the TaskRun a record is of, at each event of the record; a delete also
// tells the record store that the cache has let the record go.
func (r *Reconciler) recordEvents() handler.EventHandler {
	wake := handler.EnqueueRequestsFromMapFunc(taskRunOfRecord)
	return handler.Funcs{
		CreateFunc:  wake.Create,
		UpdateFunc:  wake.Update,
		GenericFunc: wake.Generic,
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.records.seenGone(e.Object)
			wake.Delete(ctx, e, q)
		},
	}
}

func taskRunOfRecord(_ context.Context, o client.Object) []reconcile.Request {
	ref := o.(*berthv1.Allocation).Spec.TaskRun
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}}}
}

func ledgerHosts(cfg *config.Config) []allocation.Host {
	hosts := make([]allocation.Host, 0, len(cfg.Hosts))
	for _, h := range cfg.Hosts {
		hosts = append(hosts, allocation.Host{Name: h.Name, Platform: string(h.Platform), Capacity: h.Concurrency})
	}
	return hosts
}

// namespaceCaps applies max-tasks-per-namespace to every platform.
func namespaceCaps(cfg *config.Config) map[string]int {
	caps := map[string]int{}
	if cfg.MaxTasksPerNamespace > 0 {
		for p := range cfg.Platforms {
			caps[string(p)] = cfg.MaxTasksPerNamespace
		}
	}
	return caps
}

func taskRunOfSecret(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetName()
	if len(name) <= len(contract.SecretPrefix) || name[:len(contract.SecretPrefix)] != contract.SecretPrefix {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name[len(contract.SecretPrefix):]}}}
}
