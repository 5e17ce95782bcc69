//go:build stack

package taskrun_test

import (
	"context"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"

	"github.com/berth-ci/berth/internal/contract"
)

// TestHotReloadIsJudgedPerPlatform: an edit that breaks every host of linux/s390x and adds a
// platform with no settings leaves linux/s390x served with its last good settings (a Warning
// Event names the broken key), fails only the new platform's tasks with an error secret naming
// its key, and serves the local platform as before.
func TestHotReloadIsJudgedPerPlatform(t *testing.T) {
	// A config of its own, so that the controller running now is known to have put it in force
	// (an earlier one may have been applied by a controller since restarted): the edit below
	// must find it as the last good one.
	applyConfig(t, 2, map[string]string{"instance-tag": "hot-reload"})
	defer applyConfig(t, 2, nil)
	broken := map[string]string{"dynamic-platforms": "linux/riscv64", "instance-tag": "hot-reload"}
	for _, h := range stack.Fleet.Hosts {
		broken["host."+h.Name+".concurrency"] = "two"
	}
	applyConfig(t, 2, broken)
	first := stack.Fleet.Hosts[0].Name
	eventually(t, "a Warning Event names the broken key", func() (bool, error) {
		return controllerEvent("ConfigKeptLastGood", "platform "+platform+" keeps its last good settings: error: host."+first+".concurrency: \"two\" is not a whole number")
	})

	ns := namespace(t)
	served := create(t, userTaskRun(ns, "kept", platform, ""))
	if host := string(secretOf(t, served).Data["host"]); !strings.Contains(host, "@") {
		t.Fatalf("linux/s390x must be served with its last good settings; secret host %q, error %q", host, secretOf(t, served).Data["error"])
	}
	bare := create(t, userTaskRun(ns, "bare", "linux/riscv64", ""))
	msg := string(secretOf(t, bare).Data["error"])
	for _, want := range []string{"platform linux/riscv64 is broken", "dynamic.linux-riscv64.type", "no dynamic.linux-riscv64.* settings", contract.ConfigLabel} {
		if !strings.Contains(msg, want) {
			t.Errorf("error secret of the bare platform lacks %q: %s", want, msg)
		}
	}
	local := create(t, userTaskRun(ns, "local", "linux/amd64", ""))
	if host := string(secretOf(t, local).Data["host"]); host != contract.Localhost {
		t.Errorf("the local platform must be served as before; host %q", host)
	}
	for _, tr := range []*pipelinev1.TaskRun{served, bare, local} {
		if err := stack.StandIn.Finish(context.Background(), keyOf(tr), nil); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, ns)
}
