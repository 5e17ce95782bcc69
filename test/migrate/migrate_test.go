//go:build stack

package migrate

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/controller/taskrun"
	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/hostops"
)

// What the upstream controller's installation looks like (its deploy/operator manifests and
// the host-config Helm chart's output in ../shared/real/host-config/rendered).
const (
	mpcNamespace   = "multi-platform-controller"
	mpcDeployment  = "multi-platform-controller"
	mpcAdminSecret = "ibm-s390x-ssh-key"
	mpcHostName    = "s390x-static-1"
	platform       = "linux/s390x"
	runbook        = "docs/migrate-from-mpc.md"
)

// TestSwitchOverRunbook starts from what the upstream controller leaves on a cluster and
// performs the runbook's steps in order, each named as the runbook's heading: in the end every
// old TaskRun is released and its build user gone from the host, the old secrets and internal
// TaskRun are deleted, and a new TaskRun gets a key that logs into the host.
func TestSwitchOverRunbook(t *testing.T) {
	doc := readRunbook(t)
	host := stack.Fleet.Hosts[0]
	tenant := stacktest.NewTenant(t, stack, "app")
	old := leaveWhatUpstreamLeaves(t, host, tenant.Namespace)
	var berth *exec.Cmd
	var fresh *pipelinev1.TaskRun
	berthLog := filepath.Join(t.TempDir(), "berth.log")
	t.Cleanup(func() {
		if berth != nil && berth.ProcessState == nil {
			stopBerth(t, berth)
		}
		if t.Failed() {
			if out, err := os.ReadFile(berthLog); err == nil {
				lines := strings.Split(string(out), "\n")
				t.Logf("berth's log ends:\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
			}
		}
	})

	steps := []struct {
		name string
		do   func(t *testing.T)
	}{
		{"Copy the host configuration and its Secrets into berth's namespace", func(t *testing.T) {
			doc.run(t, "Copy the host configuration and its Secrets into berth's namespace")
			var cm corev1.ConfigMap
			get(t, client.ObjectKey{Namespace: devstack.Namespace, Name: "host-config"}, &cm)
			if cm.Labels[contract.ConfigLabel] == "" || cm.Data["host."+mpcHostName+".address"] != host.Address {
				t.Fatalf("berth's copy of host-config: labels %v, data %v", cm.Labels, cm.Data)
			}
			var key corev1.Secret
			get(t, client.ObjectKey{Namespace: devstack.Namespace, Name: mpcAdminSecret}, &key)
			if !bytes.Equal(key.Data["id_rsa"], stack.Fleet.AdminKeyPEM) {
				t.Fatalf("berth's copy of %s does not hold the admin key", mpcAdminSecret)
			}
		}},
		{"Check the configuration as berth reads it", func(t *testing.T) {
			doc.run(t, "Check the configuration as berth reads it") // exits 1 unless every platform is usable
		}},
		{"Stop the upstream controller", func(t *testing.T) {
			doc.run(t, "Stop the upstream controller")
			var d appsv1.Deployment
			get(t, client.ObjectKey{Namespace: mpcNamespace, Name: mpcDeployment}, &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
				t.Fatalf("the upstream controller's Deployment still asks for %v replicas", d.Spec.Replicas)
			}
		}},
		{"Install berth", func(t *testing.T) {
			// berth's CRDs, RBAC and webhook registration are in place (the stack applied
			// them); what is left is the Deployment, played by the built binary with its flags.
			berth = startBerth(t, berthLog)
		}},
		{"Check that berth adopted what the upstream controller left", func(t *testing.T) {
			doc.run(t, "Check that berth adopted what the upstream controller left")
			var marker corev1.ConfigMap
			get(t, client.ObjectKey{Namespace: devstack.Namespace, Name: taskrun.SwitchoverMarker}, &marker)
			if marker.Data["adopted"] != "2" {
				t.Fatalf("the switch-over marker says %v, want 2 TaskRuns adopted", marker.Data)
			}
			// The ended TaskRun may be cleaned already; its Event stays.
			for _, o := range old.userTasks() {
				adoptedEvent(t, o.tr, o.user)
			}
			rec := stacktest.Record(t, admin(), old.building.tr)
			if rec.Status.Phase != berthv1.PhaseReady || rec.Status.BuildUser != old.building.user || rec.Status.Login == nil || rec.Status.Login.Host != mpcHostName {
				t.Fatalf("the mid-build TaskRun's record: phase %s, user %s, login %+v; want Ready, %s on %s",
					rec.Status.Phase, rec.Status.BuildUser, rec.Status.Login, old.building.user, mpcHostName)
			}
			// berth keeps the task's secret as the upstream controller wrote it, and its
			// user can still log in: the build goes on.
			var s corev1.Secret
			get(t, client.ObjectKeyFromObject(old.building.secret), &s)
			if !bytes.Equal(s.Data["id_rsa"], old.building.secret.Data["id_rsa"]) || len(s.OwnerReferences) > 0 {
				t.Fatal("the mid-build TaskRun's secret was changed")
			}
			loginWorks(t, host, s)
			if now := stacktest.Get(t, admin(), old.building.tr); !controllerutil.ContainsFinalizer(now, contract.Finalizer) {
				t.Fatal("the finalizer of the TaskRun still building was released")
			}
			untouched(t, old.provision)
			// The task on a host berth does not know is let go, and left to build with what
			// it has: no slot, no user of berth's.
			event(t, old.elsewhere.tr, "AdoptionFailed", retiredHost)
			eventually(t, old.elsewhere.tr.Name+" is released", func() (bool, error) {
				now := stacktest.Get(t, admin(), old.elsewhere.tr)
				return len(now.Finalizers) == 0 && now.Labels[contract.AssignedHostLabel] == "", nil
			})
			event(t, old.elsewhere.tr, "ForeignSecret", old.elsewhere.secret.Name)
			// A TaskRun its tenant labelled alike, with nothing of the upstream controller's
			// behind it, is not adopted (the marker counts two) but waits as a new task.
			event(t, old.labelled, "AdoptionUnproven", hostops.UpstreamUserName(old.labelled.Namespace, old.labelled.Name))
			if err := admin().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(old.labelled.UID)}, &berthv1.Allocation{}); err == nil {
				if rec := stacktest.Record(t, admin(), old.labelled); rec.Status.Message == "adopted from the controller berth replaced" {
					t.Fatalf("%s, labelled by its tenant only, was adopted", old.labelled.Name)
				}
			}
		}},
		{"Let the adopted TaskRuns end", func(t *testing.T) {
			// The build ends, as Tekton would end it.
			if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(old.building.tr), nil); err != nil {
				t.Fatal(err)
			}
			for _, o := range old.userTasks() {
				eventually(t, o.tr.Name+" is released and its record gone", func() (bool, error) {
					now := stacktest.Get(t, admin(), o.tr)
					if !now.IsDone() || len(now.Finalizers) > 0 {
						return false, fmt.Errorf("done %v, finalizers %v", now.IsDone(), now.Finalizers)
					}
					var rec berthv1.Allocation
					err := admin().Get(context.Background(), client.ObjectKey{Namespace: devstack.Namespace, Name: string(o.tr.UID)}, &rec)
					return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
				})
				if out, err := host.Run(context.Background(), "if getent passwd "+o.user+" || test -e /home/"+o.user+"; then echo left; fi"); err != nil || out != "" {
					t.Fatalf("the upstream controller's build user %s is still on %s (%q, %v)", o.user, host.Name, out, err)
				}
			}
			doc.run(t, "Let the adopted TaskRuns end")
			untouched(t, old.provision)
		}},
		{"Remove what the upstream controller left", func(t *testing.T) {
			doc.run(t, "Remove what the upstream controller left")
			for _, o := range old.userTasks() {
				gone(t, o.secret)
			}
			gone(t, old.provision)
			var still corev1.Secret // its TaskRun still runs
			get(t, client.ObjectKeyFromObject(old.elsewhere.secret), &still)
			var key corev1.Secret // an admin key is no task's secret
			get(t, client.ObjectKey{Namespace: devstack.Namespace, Name: mpcAdminSecret}, &key)
		}},
		{"Run a new build", func(t *testing.T) {
			fresh = tenant.Create(t, tenant.TaskRun("build-after-switch", platform))
			rec := stacktest.Ready(t, admin(), fresh)
			s := stacktest.SecretOf(t, admin(), fresh)
			if !regexp.MustCompile(`^u-[0-9a-f]{24}-[0-9]+@`+regexp.QuoteMeta(host.Address)+`$`).Match(s.Data["host"]) ||
				!strings.HasPrefix(string(s.Data["host"]), rec.Status.BuildUser+"@") || rec.Status.Login.Host != mpcHostName {
				t.Fatalf("the new TaskRun got host %q (record: %s on %+v)", s.Data["host"], rec.Status.BuildUser, rec.Status.Login)
			}
			loginWorks(t, host, *s)
		}},
	}

	var names []string
	for _, s := range steps {
		names = append(names, s.name)
	}
	if !slices.Equal(doc.steps, names) {
		t.Fatalf("the runbook's steps and this test's differ:\nrunbook: %q\ntest:    %q", doc.steps, names)
	}
	for i, s := range steps {
		if !t.Run(fmt.Sprintf("%d %s", i+1, s.name), s.do) {
			return
		}
	}

	// berth goes on as usual: the new tasks' users go when they end, and nothing is owed. The
	// tenant's labelled TaskRun was served as a new task once the adopted ones freed the host.
	stacktest.Ready(t, admin(), old.labelled)
	for _, tr := range []*pipelinev1.TaskRun{fresh, old.labelled} {
		if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil); err != nil {
			t.Fatal(err)
		}
	}
	// No record, no finalizer and no host for any TaskRun of the namespace, build-elsewhere
	// (still building) included: berth never served it.
	eventually(t, "berth owes nothing for "+tenant.Namespace, func() (bool, error) {
		return owesNothing(tenant.Namespace)
	})
	if users, err := host.BuildUsers(context.Background()); err != nil || len(users) > 0 {
		t.Fatalf("build users left on %s: %v (%v)", host.Name, users, err)
	}
	// Once the task berth could not adopt has ended, step 7 run again deletes its secret.
	if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(old.elsewhere.tr), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, old.elsewhere.tr.Name+" has ended", func() (bool, error) {
		return stacktest.Get(t, admin(), old.elsewhere.tr).IsDone(), nil
	})
	doc.run(t, "Remove what the upstream controller left")
	gone(t, old.elsewhere.secret)
	stopBerth(t, berth)
}

// oldTask is a user TaskRun the upstream controller served: its secret and the build user its
// provision task made on the host.
type oldTask struct {
	tr     *pipelinev1.TaskRun
	secret *corev1.Secret
	user   string
}

// upstreamState is what the upstream controller leaves when it is stopped.
type upstreamState struct {
	building oldTask // still building
	ended    oldTask // succeeded, the finalizer not yet released
	// elsewhere still builds on a host the ConfigMap no longer lists (as a task on one of
	// the upstream controller's VMs does): berth cannot adopt it.
	elsewhere oldTask
	// provision is one of its provision TaskRuns, in its namespace: it deletes those that
	// succeeded, so most builds have their user on the host and nothing else to show for it.
	provision *pipelinev1.TaskRun
	// labelled is no task of the upstream controller's: its tenant labelled it alike, before
	// berth's first start, with no user on the host or provision TaskRun behind it.
	labelled *pipelinev1.TaskRun
}

func (s upstreamState) userTasks() []oldTask { return []oldTask{s.building, s.ended} }

// leaveWhatUpstreamLeaves puts the upstream controller's state on the cluster and the host:
// its Deployment, its host-config and admin key in its namespace, two user TaskRuns with its
// labels, finalizer, secret and build user (one building, one ended), and one of its
// provision TaskRuns; and a TaskRun a tenant labelled alike with nothing behind it.
func leaveWhatUpstreamLeaves(t *testing.T, host *sshhosts.Host, ns string) upstreamState {
	t.Helper()
	ctx := context.Background()
	if err := stack.ControlPlane.EnsureNamespace(ctx, mpcNamespace); err != nil {
		t.Fatal(err)
	}
	one := int32(1)
	selector := map[string]string{"app": mpcDeployment}
	create(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: mpcDeployment},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: selector},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "multi-platform-controller"}}}}}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: mpcAdminSecret},
		Data: map[string][]byte{"id_rsa": stack.Fleet.AdminKeyPEM}})
	prefix := "host." + mpcHostName + "."
	create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: "host-config",
		Labels: map[string]string{contract.ConfigLabel: "hosts"}},
		Data: map[string]string{
			"local-platforms":      "linux/x86_64,local,localhost,",
			prefix + "address":     host.Address,
			prefix + "platform":    platform,
			prefix + "user":        "root",
			prefix + "secret":      mpcAdminSecret,
			prefix + "concurrency": "2",
		}})

	var st upstreamState
	st.building = servedByUpstream(t, host, ns, "build-mid")
	st.ended = servedByUpstream(t, host, ns, "build-done")
	if err := stack.StandIn.Finish(ctx, client.ObjectKeyFromObject(st.ended.tr), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "build-done has succeeded", func() (bool, error) {
		return stacktest.Get(t, admin(), st.ended.tr).IsDone(), nil
	})
	st.elsewhere = servedElsewhere(t, ns, "build-elsewhere")
	st.labelled = (&stacktest.Tenant{Namespace: ns}).TaskRun("build-labelled", platform)
	st.labelled.Labels[contract.AssignedHostLabel] = mpcHostName
	st.labelled.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
	st.labelled.Finalizers = []string{contract.Finalizer}
	create(t, st.labelled)
	eventually(t, "Tekton resolved "+st.labelled.Name, func() (bool, error) {
		return stacktest.Get(t, admin(), st.labelled).Status.TaskSpec != nil, nil
	})
	st.provision = &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: "build-mid-prov-1a2b3",
		Labels: map[string]string{contract.TaskTypeLabel: "provision", contract.UserTaskNamespaceLabel: ns,
			contract.UserTaskNameLabel: "build-mid", contract.AssignedHostLabel: mpcHostName,
			contract.TargetPlatformLabel: contract.PlatformLabelValue(platform)}},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "provision-shared-host"},
			Params: pipelinev1.Params{
				{Name: "SECRET_NAME", Value: *pipelinev1.NewStructuredValues(contract.SecretPrefix + "build-mid")},
				{Name: "TASKRUN_NAME", Value: *pipelinev1.NewStructuredValues("build-mid")},
				{Name: "NAMESPACE", Value: *pipelinev1.NewStructuredValues(ns)},
				{Name: "HOST", Value: *pipelinev1.NewStructuredValues(host.Address)},
				{Name: "USER", Value: *pipelinev1.NewStructuredValues("root")},
				{Name: "RAW_PLATFORM", Value: *pipelinev1.NewStructuredValues(contract.PlatformLabelValue(platform))},
			}}}
	create(t, st.provision)
	return st
}

// servedByUpstream makes a TaskRun as the upstream controller left it once served: labelled
// with its host and platform, its finalizer on, its build user made on the host by the commands
// of its provision task (deploy/operator/provision-shared-host.sh: the user named from the
// TaskRun's name and namespace, useradd -m, a fresh key in authorized_keys, a build
// directory), and the secret that task writes (id_rsa, host, user-dir; labelled, no owner).
func servedByUpstream(t *testing.T, host *sshhosts.Host, ns, name string) oldTask {
	t.Helper()
	ctx := context.Background()
	tr := (&stacktest.Tenant{Namespace: ns}).TaskRun(name, platform)
	tr.Labels[contract.AssignedHostLabel] = mpcHostName
	tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
	tr.Finalizers = []string{contract.Finalizer}
	create(t, tr)
	eventually(t, "Tekton resolved "+name, func() (bool, error) {
		return stacktest.Get(t, admin(), tr).Status.TaskSpec != nil, nil
	})
	script := fmt.Sprintf(`set -eu
TASKRUN_NAME=%s NAMESPACE=%s
USERNAME=u-$(echo "$TASKRUN_NAME$NAMESPACE" | md5sum | cut -b-28)
cd /root
rm -f "$USERNAME" "$USERNAME".pub
useradd -m "$USERNAME" -p "$(openssl rand -base64 12)"
ssh-keygen -q -N '' -f "$USERNAME" >/dev/null
su "$USERNAME" -c 'mkdir /home/'"$USERNAME"'/.ssh'
su "$USERNAME" -c 'mkdir /home/'"$USERNAME"'/build'
mv "$USERNAME".pub /home/"$USERNAME"/.ssh/authorized_keys
chown "$USERNAME" /home/"$USERNAME"/.ssh/authorized_keys
echo "$USERNAME"
cat "$USERNAME"
rm "$USERNAME"`, name, ns)
	out, err := host.Run(ctx, script)
	if err != nil {
		t.Fatalf("making the upstream controller's build user for %s: %v", name, err)
	}
	user, key, _ := strings.Cut(out, "\n")
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: contract.SecretPrefix + name,
		Labels: map[string]string{contract.SecretLabel: "true"}},
		Data: map[string][]byte{"id_rsa": []byte(key), "host": []byte(user + "@" + host.Address), "user-dir": []byte("/home/" + user)}}
	create(t, secret)
	loginWorks(t, host, *secret)
	return oldTask{tr: tr, secret: secret, user: user}
}

// retiredHost is a static host the upstream controller served that is no longer in the
// ConfigMap.
const retiredHost = "s390x-static-2"

// servedElsewhere makes a TaskRun as the upstream controller left it on retiredHost: its
// labels, finalizer and secret (that host is not here, so neither is its user).
func servedElsewhere(t *testing.T, ns, name string) oldTask {
	t.Helper()
	tr := (&stacktest.Tenant{Namespace: ns}).TaskRun(name, platform)
	tr.Labels[contract.AssignedHostLabel] = retiredHost
	tr.Labels[contract.TargetPlatformLabel] = contract.PlatformLabelValue(platform)
	tr.Finalizers = []string{contract.Finalizer}
	create(t, tr)
	eventually(t, "Tekton resolved "+name, func() (bool, error) {
		return stacktest.Get(t, admin(), tr).Status.TaskSpec != nil, nil
	})
	user := hostops.UpstreamUserName(ns, name)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: contract.SecretPrefix + name,
		Labels: map[string]string{contract.SecretLabel: "true"}},
		Data: map[string][]byte{"id_rsa": []byte("a key of the retired host"), "host": []byte(user + "@198.51.100.7"), "user-dir": []byte("/home/" + user)}}
	create(t, secret)
	return oldTask{tr: tr, secret: secret, user: user}
}

// startBerth runs the built berth controller as config/manager/deployment.yaml runs it: its
// command and flags, POD_NAMESPACE, under its ServiceAccount's RBAC. Only the addresses
// change: the webhook where the stack's apiserver calls it (with the certificate it trusts),
// the health probes on a loopback port of their own, and no metrics endpoint (its certificate
// is cert-manager's, and nothing here scrapes it). It returns once /readyz answers, as the
// Deployment's readiness probe asks.
func startBerth(t *testing.T, logPath string) *exec.Cmd {
	t.Helper()
	d := stacktest.ShippedController(t)
	c := d.Spec.Template.Spec.Containers[0]
	if !slices.Equal(c.Command, []string{"berth", "controller"}) {
		t.Fatalf("the Deployment runs %q, not berth controller", c.Command)
	}
	health := freeLoopbackAddress(t)
	webhook := stack.Webhook
	set := map[string]string{
		"--metrics-bind-address":      "0",
		"--metrics-cert-dir":          "",
		"--health-probe-bind-address": health,
		"--webhook-port":              fmt.Sprint(webhook.Port),
		"--webhook-cert-dir":          webhook.CertDir,
	}
	var args []string
	for _, a := range c.Args {
		flag, _, _ := strings.Cut(a, "=")
		v, ok := set[flag]
		switch {
		case !ok:
			args = append(args, a)
		case v != "":
			args = append(args, flag+"="+v)
		}
		delete(set, flag)
	}
	if len(set) > 0 {
		t.Fatalf("the Deployment no longer sets %v: this test's changes to its flags need a look", set)
	}
	kubeconfig, err := stack.ControllerKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	args = append(args, "--webhook-host="+webhook.Host, "--kubeconfig="+kubeconfig)
	cmd := exec.Command(berthBin, append([]string{"controller"}, args...)...)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+devstack.Namespace)
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log.Close()
	t.Logf("berth controller %s (log %s)", strings.Join(args, " "), logPath)
	eventually(t, "berth answers /readyz", func() (bool, error) {
		if cmd.ProcessState != nil {
			return false, fmt.Errorf("berth exited")
		}
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + health + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return cmd
}

func stopBerth(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("berth did not stop cleanly: %v", err)
	}
}

func freeLoopbackAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// runbookDoc is the runbook: its numbered steps under "During", and each step's commands.
type runbookDoc struct {
	steps    []string
	commands map[string]string
}

var (
	stepHeading = regexp.MustCompile(`^### ([0-9]+)\. (.+)$`)
	shBlock     = regexp.MustCompile("(?s)```sh\n(.*?)```")
)

func readRunbook(t *testing.T) runbookDoc {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, runbook))
	if err != nil {
		t.Fatal(err)
	}
	_, during, ok := strings.Cut(string(data), "\n## During\n")
	if !ok {
		t.Fatalf("%s has no section During", runbook)
	}
	during, _, _ = strings.Cut(during, "\n## ")
	doc := runbookDoc{commands: map[string]string{}}
	var current string
	var body strings.Builder
	flush := func() {
		if current != "" {
			if m := shBlock.FindStringSubmatch(body.String()); m != nil {
				doc.commands[current] = m[1]
			}
		}
		body.Reset()
	}
	for line := range strings.Lines(during) {
		if m := stepHeading.FindStringSubmatch(strings.TrimRight(line, "\n")); m != nil {
			flush()
			if want := fmt.Sprint(len(doc.steps) + 1); m[1] != want {
				t.Fatalf("%s: step %q is numbered %s, want %s", runbook, m[2], m[1], want)
			}
			current = m[2]
			doc.steps = append(doc.steps, current)
			continue
		}
		body.WriteString(line)
	}
	flush()
	return doc
}

// run runs the step's commands as the runbook gives them, with bash, as a cluster admin,
// with the kubectl of the test ground and the built berth first on PATH.
func (d runbookDoc) run(t *testing.T, step string) {
	t.Helper()
	script, ok := d.commands[step]
	if !ok {
		t.Fatalf("%s has no commands for step %q", runbook, step)
	}
	kubectl, err := controlplane.BinaryDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+stack.KubeConfigPath,
		"PATH="+kubectl+":"+filepath.Dir(berthBin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	t.Logf("step %q:\n%s", step, out)
	if err != nil {
		t.Fatalf("the commands of step %q failed: %v", step, err)
	}
}

func admin() client.Client { return stack.ControlPlane.Client }

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := admin().Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, key client.ObjectKey, o client.Object) {
	t.Helper()
	if err := admin().Get(context.Background(), key, o); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	stacktest.Eventually(t, what, cond)
}

// gone waits until o is deleted.
func gone(t *testing.T, o client.Object) {
	t.Helper()
	key := client.ObjectKeyFromObject(o)
	eventually(t, fmt.Sprintf("%T %s is deleted", o, key), func() (bool, error) {
		err := admin().Get(context.Background(), key, o.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// loginWorks logs in with the secret's key as the user its host names, on host, and checks
// who that is.
func loginWorks(t *testing.T, host *sshhosts.Host, s corev1.Secret) {
	t.Helper()
	user, address, _ := strings.Cut(string(s.Data["host"]), "@")
	if address != host.Address {
		t.Fatalf("secret %s names host %q, want %s", s.Name, address, host.Address)
	}
	signer, err := ssh.ParsePrivateKey(s.Data["id_rsa"])
	if err != nil {
		t.Fatalf("the key of secret %s: %v", s.Name, err)
	}
	out, err := host.RunAs(context.Background(), user, signer, "id -un")
	if err != nil || strings.TrimSpace(out) != user {
		t.Fatalf("logging in as %s with the key of %s: %q, %v", user, s.Name, out, err)
	}
}

// adoptedEvent checks that berth told the TaskRun it took it over, naming the build user.
func adoptedEvent(t *testing.T, tr *pipelinev1.TaskRun, user string) {
	t.Helper()
	event(t, tr, "Adopted", user)
}

// event waits for an Event of reason on tr whose note mentions what.
func event(t *testing.T, tr *pipelinev1.TaskRun, reason, what string) {
	t.Helper()
	eventually(t, "an Event "+reason+" on "+tr.Name+" naming "+what, func() (bool, error) {
		var list eventsv1.EventList
		if err := admin().List(context.Background(), &list, client.InNamespace(tr.Namespace)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.UID == tr.UID && strings.Contains(e.Note, what) {
				return true, nil
			}
		}
		return false, nil
	})
}

// owesNothing tells that no TaskRun of ns carries berth's finalizer or a host, and that berth
// keeps no record for any.
func owesNothing(ns string) (bool, error) {
	ctx := context.Background()
	var trs pipelinev1.TaskRunList
	if err := admin().List(ctx, &trs, client.InNamespace(ns)); err != nil {
		return false, err
	}
	for _, tr := range trs.Items {
		if len(tr.Finalizers) > 0 || tr.Labels[contract.AssignedHostLabel] != "" {
			return false, fmt.Errorf("%s has finalizers %v, host %q", tr.Name, tr.Finalizers, tr.Labels[contract.AssignedHostLabel])
		}
	}
	var recs berthv1.AllocationList
	if err := admin().List(ctx, &recs, client.InNamespace(devstack.Namespace)); err != nil {
		return false, err
	}
	for _, rec := range recs.Items {
		if rec.Spec.TaskRun.Namespace == ns {
			return false, fmt.Errorf("record of %s: phase %s, message %q", rec.Spec.TaskRun.Name, rec.Status.Phase, rec.Status.Message)
		}
	}
	return true, nil
}

// untouched checks that berth left the upstream controller's internal TaskRun alone: no
// record, its labels as they were, no finalizer.
func untouched(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	now := stacktest.Get(t, admin(), tr)
	if now.Labels[contract.AssignedHostLabel] != mpcHostName || now.Labels[contract.TaskTypeLabel] != "provision" || len(now.Finalizers) > 0 {
		t.Fatalf("berth changed the upstream provision TaskRun: labels %v, finalizers %v", now.Labels, now.Finalizers)
	}
	var recs berthv1.AllocationList
	if err := admin().List(context.Background(), &recs, client.InNamespace(devstack.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs.Items {
		if rec.Spec.TaskRun.Namespace == mpcNamespace {
			t.Fatalf("berth keeps a record of %s", rec.Spec.TaskRun.Key())
		}
	}
}
