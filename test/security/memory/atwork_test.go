package memory_test

import (
	"strings"
	"testing"
)

// Goroutines as a goroutine profile (debug=2) of the controller shows them, cut to the frames
// atWork reads.
const (
	watchWaiting = `goroutine 158 [sync.Cond.Wait]:
sync.(*Cond).Wait(0x27a68712e0c0?)
golang.org/x/net/http2.(*pipe).Read(0x27a686ac6ab0, {0x27a687434001, 0xdff, 0xdff})
k8s.io/apimachinery/pkg/runtime/serializer/streaming.(*decoder).Decode(0x27a686e8d7c0, 0x0, {0x2dcb4e0, 0x27a687203640})
k8s.io/client-go/rest/watch.(*Decoder).Decode(0x27a687228220)
k8s.io/apimachinery/pkg/watch.(*StreamWatcher).receive(0x27a686e8d810)
created by k8s.io/apimachinery/pkg/watch.NewStreamWatcherWithLogger in goroutine 153`
	watchDecoding = `goroutine 161 [runnable]:
encoding/json.(*decodeState).skip(0x27a687360510)
k8s.io/apimachinery/pkg/runtime/serializer/json.(*Serializer).Decode(0x27a6871f4fa0, {0x27a6887ca000, 0x1403da, 0x25e000}, 0x0, {0x2dcb4e0, 0x27a687194f40})
k8s.io/client-go/rest/watch.(*Decoder).Decode(0x27a687228740)
k8s.io/apimachinery/pkg/watch.(*StreamWatcher).receive(0x27a686e8d950)
created by k8s.io/apimachinery/pkg/watch.NewStreamWatcherWithLogger in goroutine 145`
	watchHandingOver = `goroutine 162 [select]:
k8s.io/apimachinery/pkg/watch.(*StreamWatcher).receive(0x27a686e8d950)
created by k8s.io/apimachinery/pkg/watch.NewStreamWatcherWithLogger in goroutine 145`
	informerWaiting = `goroutine 153 [select]:
k8s.io/client-go/tools/cache.handleAnyWatch({0x2dda368, 0x27a686da3470}, {0x0?, 0x27a686ff5960?, 0x4c27900?})
k8s.io/client-go/tools/cache.handleWatch({0x2dda368?, 0x27a686da3470?}, {0x9?, 0x40?, 0x4c27900?})
k8s.io/client-go/tools/cache.(*Reflector).watch(0x27a686a5b0e0, {0x2dda368, 0x27a686da3470}, {0x2dca928, 0x27a686e8d810}, 0x27a686e20150)
created by k8s.io/apimachinery/pkg/util/wait.(*Group).Start in goroutine 148`
	informerStoring = `goroutine 154 [runnable]:
github.com/berth-ci/berth/internal/controller/taskrun.stripTaskRun({0x2a0c3e0, 0x27a687194f40})
k8s.io/client-go/tools/cache.(*RealFIFO).addToItems_locked(0x27a686e8d000, 0x2, {0x2a0c3e0, 0x27a687194f40})
k8s.io/client-go/tools/cache.handleAnyWatch({0x2dda368, 0x27a686da3470}, {0x0?, 0x27a686ff5960?, 0x4c27900?})
created by k8s.io/apimachinery/pkg/util/wait.(*Group).Start in goroutine 148`
	reconciling = `goroutine 300 [select]:
k8s.io/client-go/rest.(*Request).request(0x27a68738b980, {0x2dda410, 0x27a686c490a0}, 0x27a687027a40)
github.com/berth-ci/berth/internal/controller/taskrun.(*Reconciler).Reconcile(0x27a686a5b0e0, {0x2dda368, 0x27a686da3470})
created by sigs.k8s.io/controller-runtime/pkg/internal/controller.(*Controller[...]).Start.func2 in goroutine 120`
	writingAnEvent = `goroutine 96 [select]:
k8s.io/client-go/tools/events.(*EventSinkImpl).Create(0x2dda3a0?, {0x2dda410, 0x27a686c490a0}, 0x27a6872d1688)
github.com/berth-ci/berth/internal/controller.(*eventWriter).write(0x27a6871f4050, {0x2dda3a0, 0x27a6871f40f0}, 0x27a6872d1688)
created by k8s.io/client-go/tools/events.(*eventBroadcasterImpl).StartEventWatcher in goroutine 1`
	elsewhere = `goroutine 1 [select]:
sigs.k8s.io/controller-runtime/pkg/manager.(*controllerManager).Start(0x27a686a5b0e0, {0x2dda368, 0x27a686da3470})
main.main()`
)

func TestAtWorkTellsAGoroutineThatHoldsWhatItWorksOn(t *testing.T) {
	for _, c := range []struct {
		goroutine string
		atWork    bool
	}{
		{watchWaiting, false},
		{watchDecoding, true},
		{watchHandingOver, true},
		{informerWaiting, false},
		{informerStoring, true},
		{reconciling, true},
		{writingAnEvent, true},
		{elsewhere, false},
	} {
		stacks := strings.Join([]string{elsewhere, watchWaiting, c.goroutine, informerWaiting}, "\n\n") + "\n"
		got := atWork(stacks)
		header, _, _ := strings.Cut(c.goroutine, "\n")
		if c.atWork && !strings.HasPrefix(got, header) {
			t.Errorf("%s: atWork says %q, want it named", header, got)
		}
		if !c.atWork && got != "" {
			t.Errorf("%s: atWork says %q, want none at work", header, got)
		}
	}
}
