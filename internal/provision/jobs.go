package provision

import (
	"context"
	"sync"
)

// jobs runs host work on a bounded pool, once per job key, and keeps each outcome until it is
// forgotten. The SSH provisioner does its host work on it.
type jobs struct {
	mu     sync.Mutex
	byKey  map[string]*job
	slots  chan struct{}
	notify Notifier
}

type job struct {
	outcome   Outcome
	done      chan struct{}
	forgotten bool
}

func newJobs(workers int, notify Notifier) *jobs {
	if workers <= 0 {
		workers = 1
	}
	if notify == nil {
		notify = func(string) {}
	}
	return &jobs{byKey: map[string]*job{}, slots: make(chan struct{}, workers), notify: notify}
}

// run starts work under key unless it was started already, and returns where it stands. The
// work starts only after every job in after has ended (a clean never races the provision it
// undoes).
func (j *jobs) run(ctx context.Context, key, wake string, after []string, work func(context.Context) Outcome) Outcome {
	j.mu.Lock()
	if existing, ok := j.byKey[key]; ok {
		out := existing.outcome
		j.mu.Unlock()
		return out
	}
	var waitFor []chan struct{}
	for _, k := range after {
		if prior, ok := j.byKey[k]; ok {
			waitFor = append(waitFor, prior.done)
		}
	}
	this := &job{done: make(chan struct{})}
	j.byKey[key] = this
	j.mu.Unlock()
	go func() {
		// Detached from the reconcile that started it: the job outlives that call.
		ctx := context.WithoutCancel(ctx)
		for _, c := range waitFor {
			<-c
		}
		j.slots <- struct{}{}
		o := work(ctx)
		<-j.slots
		o.Done = true
		j.mu.Lock()
		this.outcome = o
		if this.forgotten {
			delete(j.byKey, key)
		}
		j.mu.Unlock()
		close(this.done)
		j.notify(wake)
	}()
	return Outcome{}
}

// forget drops a job's outcome (at once if it has ended, else when it ends).
func (j *jobs) forget(key string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if existing, ok := j.byKey[key]; ok {
		if existing.outcome.Done {
			delete(j.byKey, key)
		} else {
			existing.forgotten = true
		}
	}
}
