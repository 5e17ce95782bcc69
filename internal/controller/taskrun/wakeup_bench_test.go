//go:build stack

package taskrun_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// BenchmarkWakeUp measures how long a freed slot stays empty while a task waits for it: from the
// moment the finished task's assigned-host label is removed (berth releases the slot) to the
// moment the waiting task's label appears (berth gave it the slot), both as seen on a watch of
// the apiserver. One host with one slot; every iteration hands it over once. Run it with
// `make bench` (or -benchtime=50x): each iteration also provisions and cleans a build user.
func BenchmarkWakeUp(b *testing.B) {
	single := stack.StaticHostConfig(platform, 1, "linux/amd64")
	for k := range single {
		if strings.HasPrefix(k, "host.") && !strings.HasPrefix(k, "host."+stack.Fleet.Hosts[0].Name+".") {
			delete(single, k)
		}
	}
	if _, err := stack.ApplyHostConfig(context.Background(), single); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second) // let the config take effect
	ns := fmt.Sprintf("wakeup-%d", time.Now().UnixNano())
	if err := stack.ControlPlane.EnsureNamespace(context.Background(), ns); err != nil {
		b.Fatal(err)
	}
	wc, err := client.NewWithWatch(stack.ControlPlane.Config, client.Options{Scheme: c().Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := wc.Watch(ctx, &pipelinev1.TaskRunList{}, client.InNamespace(ns))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	type change struct {
		task, host string
		at         time.Time
	}
	changes := make(chan change, 1024)
	go func() {
		last := map[string]string{}
		for ev := range w.ResultChan() {
			tr, ok := ev.Object.(*pipelinev1.TaskRun)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if h := tr.Labels[contract.AssignedHostLabel]; h != last[tr.Name] {
				last[tr.Name] = h
				changes <- change{task: tr.Name, host: h, at: time.Now()}
			}
		}
	}()
	awaitHost := func(task string) time.Time {
		for c := range changes {
			if c.task == task && c.host != "" {
				return c.at
			}
		}
		return time.Time{}
	}
	mk := func(i int) *pipelinev1.TaskRun {
		tr := userTaskRun(ns, fmt.Sprintf("t-%04d", i), platform, "")
		if err := c().Create(context.Background(), tr); err != nil {
			b.Fatal(err)
		}
		return tr
	}

	holder := mk(0)
	awaitHost(holder.Name)
	var latencies []time.Duration
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		waiter := mk(i)
		// The waiter is queued once it carries the waiting label; the holder finishes once its
		// secret exists (provisioned), as a real build would.
		eventuallyB(b, func() bool { return current(waiter).Labels[contract.WaitingForPlatformLabel] != "" })
		eventuallyB(b, func() bool { return secretExists(holder) })
		if err := stack.StandIn.Finish(context.Background(), keyOf(holder), nil); err != nil {
			b.Fatal(err)
		}
		var freed time.Time
		for c := range changes {
			if c.task == holder.Name && c.host == "" {
				freed = c.at
				break
			}
		}
		latencies = append(latencies, awaitHost(waiter.Name).Sub(freed))
		holder = waiter
	}
	b.StopTimer()
	_ = stack.StandIn.Finish(context.Background(), keyOf(holder), nil)
	slices.Sort(latencies)
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(latencies[len(latencies)-1].Microseconds())/1000, "max-ms")
}

func current(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	var got pipelinev1.TaskRun
	_ = c().Get(context.Background(), client.ObjectKeyFromObject(tr), &got)
	return &got
}

func secretExists(tr *pipelinev1.TaskRun) bool {
	return c().Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: contract.SecretPrefix + tr.Name}, &corev1.Secret{}) == nil
}

func eventuallyB(b *testing.B, cond func() bool) {
	deadline := time.Now().Add(stacktest.Patience)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
