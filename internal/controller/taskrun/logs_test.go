//go:build stack

package taskrun_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/warning"
)

// loggedStep finds the log lines of one TaskRun's step (an event's reason).
func loggedStep(t *testing.T, taskRun, reason string) []map[string]any {
	t.Helper()
	return stacktest.LogLines(t, func(l map[string]any) bool { return l["taskRun"] == taskRun && l["reason"] == reason })
}

// An operator reads the story of a task in the controller's log: where it went, that its user
// was made, that its host was released. These routine steps are log lines only: no Event, so a
// task that goes well costs no Event writes. A refusal is an Event and a warning line
// (severity=warning, see package warning), not an error: berth did nothing wrong.
func TestEachStepOfATaskIsLogged(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "told", platform, ""))
	host := string(secretOf(t, tr).Data["host"])
	finish(t, tr)
	settled(t, ns)
	key := ns + "/" + tr.Name
	for _, reason := range []string{"HostAssigned", "Provisioned", "HostReleased"} {
		eventually(t, reason+" of "+key+" is logged with its platform and host", func() (bool, error) {
			for _, l := range loggedStep(t, key, reason) {
				if l["platform"] == platform && l["host"] != "" && l["level"] == "info" && l[warning.Key] == nil {
					return true, nil
				}
			}
			return false, nil
		})
	}
	if host == "" {
		t.Fatal("the task got no host")
	}
	var events corev1.EventList
	if err := c().List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == tr.Name {
			t.Errorf("a task that went well got Event %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}

	odd := create(t, userTaskRun(ns, "odd", "linux/z80", ""))
	if msg := string(secretOf(t, odd).Data["error"]); msg == "" {
		t.Fatal("a task of an unknown platform got no error secret")
	}
	oddKey := ns + "/" + odd.Name
	eventually(t, "the refusal of "+oddKey+" is a warning line", func() (bool, error) {
		for _, l := range loggedStep(t, oddKey, "UnknownPlatform") {
			if l["level"] == "info" && l[warning.Key] == warning.Value && l["platform"] == "linux/z80" {
				return true, nil
			}
		}
		return false, nil
	})
	finish(t, odd)
	settled(t, ns)
}
