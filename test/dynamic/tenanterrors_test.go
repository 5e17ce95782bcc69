package dynamic

import (
	"context"
	"regexp"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

var refPattern = regexp.MustCompile(`ref-[0-9a-f]{10}`)

// EC2 refuses RunInstances as it does when the key's IAM policies do not allow it: 403
// UnauthorizedOperation, with a message naming the principal's ARN, its account and an
// encoded authorization failure message. None of that reaches the tenant's namespace: its
// error secret, the Events there and its TaskRun's labels and annotations say what kind of
// failure it was, what to do, and a reference; the operator finds the cloud's answer under
// that reference on berth's own record, in berth's namespace.
func TestCloudRefusalStaysWithTheOperator(t *testing.T) {
	ns := namespace(t)
	const (
		platform  = "linux/arm64"
		account   = "210987654321"
		principal = "arn:aws:iam::" + account + ":user/berth-launcher"
	)
	stack.EC2.Deny("RunInstances", principal)
	t.Cleanup(func() { stack.EC2.Allow("RunInstances") })
	useConfig(t, platform, devstack.DynamicSettings{Provider: devstack.ProviderAWS, MaxInstances: 1})
	tr := task(t, ns, "denied", platform)

	msg := string(stacktest.SecretOf(t, c(), tr).Data["error"])
	for _, want := range []string{platform, "credentials or permissions", "authentication failed", "platform team", devstack.Namespace} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error secret does not say %q: %q", want, msg)
		}
	}
	ref := refPattern.FindString(msg)
	if ref == "" {
		t.Fatalf("the error secret gives no reference: %q", msg)
	}

	// The operator's side: the cloud's answer, whole, under the tenant's reference.
	note := eventNote(t, devstack.Namespace, "LaunchFailed", ref)
	for _, want := range []string{"UnauthorizedOperation", principal, "ec2:RunInstances", "Encoded authorization failure message"} {
		if !strings.Contains(note, want) {
			t.Errorf("the operator's LaunchFailed Event does not carry %q: %s", want, note)
		}
	}

	// The tenant's side, once berth has told it (the Event on its TaskRun).
	eventNote(t, ns, "CloudRefused", ref)
	cloudsWords := []string{account, "arn:aws", "berth-launcher", "UnauthorizedOperation", "Encoded authorization", devstack.AWSSecret}
	noneOf := func(where, text string) {
		for _, w := range cloudsWords {
			if strings.Contains(text, w) {
				t.Errorf("%s in the tenant's namespace carries %q: %s", where, w, text)
			}
		}
	}
	var secrets corev1.SecretList
	if err := c().List(context.Background(), &secrets, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		for k, v := range s.Data {
			noneOf("key "+k+" of Secret "+s.Name, string(v))
		}
	}
	var events eventsv1.EventList
	if err := c().List(context.Background(), &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		noneOf("Event "+e.Reason+" on "+e.Regarding.Name, e.Note)
	}
	var now pipelinev1.TaskRun
	if err := c().Get(context.Background(), client.ObjectKeyFromObject(tr), &now); err != nil {
		t.Fatal(err)
	}
	for k, v := range now.Labels {
		noneOf("label "+k, v)
	}
	for k, v := range now.Annotations {
		noneOf("annotation "+k, v)
	}

	finish(t, tr)
	settled(t, ns, 0)
	if n := len(stack.EC2.Calls("RunInstances")); n == 0 {
		t.Errorf("berth never asked EC2 for a VM: the refusal was not EC2's")
	}
}

// eventNote waits for an Event of namespace ns with reason whose note names ref, and returns
// the note.
func eventNote(t *testing.T, ns, reason, ref string) string {
	t.Helper()
	var note string
	eventually(t, "an Event "+reason+" in "+ns+" naming "+ref, func() (bool, error) {
		var events eventsv1.EventList
		if err := c().List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && strings.Contains(e.Note, ref) {
				note = e.Note
				return true, nil
			}
		}
		return false, nil
	})
	return note
}
