package controller

import (
	"context"
	"errors"
	"runtime/debug"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// gcPercent reads the runtime's GC percent.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestGCPercentIsBerthsUnlessTheOperatorChose(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	if !setGCPercent(50) || gcPercent() != 50 {
		t.Fatalf("--gc-percent=50: percent %d, want 50", gcPercent())
	}
	debug.SetGCPercent(80)
	t.Setenv("GOGC", "80")
	if setGCPercent(50) || gcPercent() != 80 {
		t.Fatalf("with GOGC=80 set: percent %d, want the operator's 80", gcPercent())
	}
	t.Setenv("GOGC", "")
	if setGCPercent(0) || gcPercent() != 80 {
		t.Fatalf("with --gc-percent=0: percent %d, want the runtime's 80 left alone", gcPercent())
	}
}

// syncingInformers answers GetInformer once synced is closed (with err), as a cache does with
// BlockUntilSynced, and says what it was asked for.
type syncingInformers struct {
	cache.Informers
	synced chan struct{}
	err    error
	asked  chan client.Object
}

func (f syncingInformers) GetInformer(ctx context.Context, obj client.Object, _ ...cache.InformerGetOption) (cache.Informer, error) {
	f.asked <- obj
	select {
	case <-f.synced:
		return nil, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestACollectionFollowsTheTaskRunsSync(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		stop        bool // the manager stops before the sync
		wantCollect int
	}{
		{name: "synced", wantCollect: 1},
		{name: "informer failed", err: errors.New("no matches for kind TaskRun"), wantCollect: 0},
		{name: "stopped first", stop: true, wantCollect: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := syncingInformers{synced: make(chan struct{}), err: tc.err, asked: make(chan client.Object, 1)}
			collected := 0
			c := collectAfterSync{cache: f, collect: func() { collected++ }}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error)
			go func() { done <- c.Start(ctx) }()
			if _, isTaskRun := (<-f.asked).(*pipelinev1.TaskRun); !isTaskRun {
				t.Fatal("it waits for an informer of something other than TaskRuns")
			}
			if collected != 0 {
				t.Fatal("collected before the TaskRuns synced")
			}
			if tc.stop {
				cancel()
			} else {
				close(f.synced)
			}
			if err := <-done; err != nil {
				t.Fatalf("Start: %v; an unsynced informer is the controller's to report, not a reason to stop the manager", err)
			}
			if collected != tc.wantCollect {
				t.Fatalf("%d collections, want %d", collected, tc.wantCollect)
			}
		})
	}
}
