//go:build stack

package taskrun_test

import (
	"context"
	"regexp"
	"sort"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// hostsByName sorts the stack's hosts as the ledger breaks ties: the first gets the first task.
func hostsByName() []*sshhosts.Host {
	hosts := append([]*sshhosts.Host{}, stack.Fleet.Hosts...)
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Name < hosts[j].Name })
	return hosts
}

func cut(t *testing.T, hosts ...*sshhosts.Host) {
	t.Helper()
	for _, h := range hosts {
		if err := h.Cut(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := h.Restore(); err != nil {
				t.Errorf("restoring %s: %v", h.Name, err)
			}
		})
	}
}

// restore brings cut hosts back, so that the cleanups berth owes them can be paid.
func restore(t *testing.T, hosts ...*sshhosts.Host) {
	t.Helper()
	for _, h := range hosts {
		if err := h.Restore(); err != nil {
			t.Fatal(err)
		}
	}
}

func finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	if err := stack.StandIn.Finish(context.Background(), keyOf(tr), nil); err != nil {
		t.Fatal(err)
	}
}

func TestCutOffHostFailsOverToAnother(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	dead := hostsByName()[0]
	cut(t, dead)
	tr := create(t, userTaskRun(ns, "failover", platform, ""))
	secret := secretOf(t, tr)
	if strings.HasSuffix(string(secret.Data["host"]), "@"+dead.Address) || len(secret.Data["id_rsa"]) == 0 {
		t.Fatalf("want a build user on another host than the cut-off %s, got host=%q error=%q", dead.Name, secret.Data["host"], secret.Data["error"])
	}
	if got := get(t, tr).Annotations[contract.FailedHostsAnnotation]; got != dead.Name {
		t.Fatalf("failed-hosts = %q, want %s", got, dead.Name)
	}
	finish(t, tr)
	// The user berth may have begun on the dead host is owed to it until it answers again.
	restore(t, dead)
	settled(t, ns)
}

func TestAllHostsCutOffEndInAnErrorSecret(t *testing.T) {
	applyConfig(t, 2, nil)
	ns := namespace(t)
	cut(t, stack.Fleet.Hosts...)
	tr := create(t, userTaskRun(ns, "stranded", platform, ""))
	msg := string(secretOf(t, tr).Data["error"])
	if !strings.Contains(msg, "no host of platform linux/s390x could be provisioned") {
		t.Fatalf("error secret %q does not name the platform", msg)
	}
	for _, h := range stack.Fleet.Hosts {
		if !strings.Contains(msg, h.Name) {
			t.Errorf("error secret does not name failed host %s: %q", h.Name, msg)
		}
	}
	finish(t, tr)
	restore(t, stack.Fleet.Hosts...)
	settled(t, ns)
}

// TestChangedHostKeyIsReportedOnTheTask: a host that presents another key than the one pinned
// is refused, and the task's owner sees why on the TaskRun: the kind of failure and a
// reference, under which the operator finds the fingerprints and the address on berth's
// record of the task.
func TestChangedHostKeyIsReportedOnTheTask(t *testing.T) {
	hosts := hostsByName()
	only, impostor := hosts[0], hosts[1]
	data := map[string]string{}
	for k, v := range stack.StaticHostConfig(platform, 2) {
		if strings.HasPrefix(k, "host."+only.Name+".") {
			data[k] = v
		}
	}
	data["host."+only.Name+".host-key"] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(impostor.HostKey)))
	rv, err := stack.ApplyHostConfig(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "config "+rv+" is in force", func() (bool, error) { return controllerEvent("ConfigApplied", "resourceVersion "+rv+":") })
	defer applyConfig(t, 2, nil)
	ns := namespace(t)
	tr := create(t, userTaskRun(ns, "pinned", platform, ""))
	if msg := string(secretOf(t, tr).Data["error"]); !strings.Contains(msg, "could be provisioned") {
		t.Fatalf("error %q", msg)
	}
	var note string
	eventually(t, "a HostKeyChanged Event on the TaskRun names the host", func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "HostKeyChanged" && e.Regarding.Name == tr.Name && strings.Contains(e.Note, only.Name) {
				note = e.Note
				return true, nil
			}
		}
		return false, nil
	})
	ref := regexp.MustCompile(`ref-[0-9a-f]{10}`).FindString(note)
	if ref == "" || !strings.Contains(note, "host key") {
		t.Errorf("the tenant's Event gives no kind of failure and reference: %s", note)
	}
	if strings.Contains(note, "SHA256:") || strings.Contains(note, only.Address) {
		t.Errorf("the tenant's Event carries a fingerprint or the host's address: %s", note)
	}
	eventually(t, "the operator's Event under "+ref+" has the fingerprints and the address", func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(context.Background(), &events, client.InNamespace(devstack.Namespace)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "HostKeyChanged" && strings.Contains(e.Note, ref) {
				return strings.Contains(e.Note, "SHA256:") && strings.Contains(e.Note, only.Address), nil
			}
		}
		return false, nil
	})
	finish(t, tr)
	// berth never logged in to the impostor, so it owes it no clean: the task settles.
	settled(t, ns)
}
