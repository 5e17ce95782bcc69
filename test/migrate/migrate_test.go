//go:build stack

package migrate

import (
	"bytes"
	"context"
	"fmt"
	"maps"
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
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
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

// What the upstream controller's installation looks like (its deploy/operator and deploy/otp
// manifests and the host-config Helm chart's output in ../shared/real/host-config/rendered).
const (
	mpcNamespace      = "multi-platform-controller"
	mpcDeployment     = "multi-platform-controller"
	mpcOTPServer      = "multi-platform-otp-server"
	mpcMetricsService = "controller-manager-metrics-service"
	mpcAdminSecret    = "ibm-s390x-ssh-key"
	mpcHostName       = "s390x-static-1"
	platform          = "linux/s390x"
	runbook           = "docs/migrate-from-mpc.md"
)

// The runbook's sections of steps, one per install layout.
const (
	defaultLayout = "During: the default layout"
	konfluxLayout = "During: on a Konflux cluster (the Konflux layout)"
)

// TestSwitchOverRunbook starts from what the upstream controller leaves on a cluster and
// performs the steps of the runbook's default layout in order, each named as the runbook's
// heading: in the end every old TaskRun is released and its build user gone from the host, the
// old secrets and internal TaskRun are deleted, and a new TaskRun gets a key that logs into the
// host.
func TestSwitchOverRunbook(t *testing.T) {
	upStack(t)
	doc := readRunbook(t, defaultLayout)
	host := stack.Fleet.Hosts[0]
	tenant := stacktest.NewTenant(t, stack, "app")
	old := leaveWhatUpstreamLeaves(t, host, tenant.Namespace)
	const berthNS = devstack.Namespace
	var berth *exec.Cmd
	var fresh *pipelinev1.TaskRun
	berthLog := filepath.Join(t.TempDir(), "berth.log")
	t.Cleanup(func() { stopAndShowLog(t, berth, berthLog) })

	steps := []step{
		{"Copy the host configuration and its Secrets into berth's namespace", func(t *testing.T) {
			doc.run(t, "Copy the host configuration and its Secrets into berth's namespace")
			var cm corev1.ConfigMap
			get(t, client.ObjectKey{Namespace: berthNS, Name: "host-config"}, &cm)
			if cm.Labels[contract.ConfigLabel] == "" || cm.Data["host."+mpcHostName+".address"] != host.Address {
				t.Fatalf("berth's copy of host-config: labels %v, data %v", cm.Labels, cm.Data)
			}
			var key corev1.Secret
			get(t, client.ObjectKey{Namespace: berthNS, Name: mpcAdminSecret}, &key)
			if !bytes.Equal(key.Data["id_rsa"], stack.Fleet.AdminKeyPEM) {
				t.Fatalf("berth's copy of %s does not hold the admin key", mpcAdminSecret)
			}
		}},
		{"Check the configuration as berth reads it", func(t *testing.T) {
			doc.run(t, "Check the configuration as berth reads it") // exits 1 unless every platform is usable
		}},
		{"Stop the upstream controller", func(t *testing.T) {
			doc.run(t, "Stop the upstream controller")
			upstreamStopped(t)
		}},
		{"Install berth", func(t *testing.T) {
			// berth's CRDs, RBAC and webhook registration are in place (the stack applied
			// them); what is left is the Deployment, played by the built binary with its flags.
			d := stacktest.ShippedController(t)
			berth = startBerth(t, d.Spec.Template.Spec.Containers[0], berthNS, devstack.ControllerServiceAccount, berthLog, noMetrics())
		}},
		{"Check that berth adopted what the upstream controller left", func(t *testing.T) {
			doc.run(t, "Check that berth adopted what the upstream controller left")
			adopted(t, berthNS, host, old)
		}},
		{"Let the adopted TaskRuns end", func(t *testing.T) {
			adoptedEnd(t, berthNS, host, old)
			doc.run(t, "Let the adopted TaskRuns end")
			untouched(t, berthNS, old.provision)
		}},
		{"Remove what the upstream controller left", func(t *testing.T) {
			doc.run(t, "Remove what the upstream controller left")
			leftRemoved(t, old)
			var key corev1.Secret // an admin key is no task's secret
			get(t, client.ObjectKey{Namespace: berthNS, Name: mpcAdminSecret}, &key)
		}},
		{"Run a new build", func(t *testing.T) {
			fresh = tenant.Create(t, tenant.TaskRun("build-after-switch", platform))
			s := newBuildsSecret(t, berthNS, host, fresh)
			loginWorks(t, host, *s)
		}},
	}
	if !runSteps(t, doc, steps) {
		return
	}
	afterTheSwitch(t, doc, berthNS, host, tenant.Namespace, old, fresh)
	stopBerth(t, berth)
}

// step is one numbered step of a section of the runbook, named as its heading.
type step struct {
	name string
	do   func(t *testing.T)
}

// runSteps checks that the steps are the section's, in its order, and runs them until one
// fails.
func runSteps(t *testing.T, doc runbookDoc, steps []step) bool {
	t.Helper()
	var names []string
	for _, s := range steps {
		names = append(names, s.name)
	}
	if !slices.Equal(doc.steps, names) {
		t.Fatalf("the runbook's steps (%s) and this test's differ:\nrunbook: %q\ntest:    %q", doc.section, doc.steps, names)
	}
	for i, s := range steps {
		if !t.Run(fmt.Sprintf("%d %s", i+1, s.name), s.do) {
			return false
		}
	}
	return true
}

// upstreamStopped checks that the upstream controller's Deployment asks for no replica.
func upstreamStopped(t *testing.T) {
	t.Helper()
	var d appsv1.Deployment
	get(t, client.ObjectKey{Namespace: mpcNamespace, Name: mpcDeployment}, &d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
		t.Fatalf("the upstream controller's Deployment still asks for %v replicas", d.Spec.Replicas)
	}
}

// adopted checks what berth, in namespace berthNS, made of what the upstream controller left
// at its first start: two TaskRuns adopted with their build users, the one still building
// keeping its secret and finalizer, the one on a host berth does not know let go, the one its
// tenant labelled not adopted, the upstream provision TaskRun left alone.
func adopted(t *testing.T, berthNS string, host *sshhosts.Host, old upstreamState) {
	t.Helper()
	var marker corev1.ConfigMap
	get(t, client.ObjectKey{Namespace: berthNS, Name: taskrun.SwitchoverMarker}, &marker)
	if marker.Data["adopted"] != "2" {
		t.Fatalf("the switch-over marker says %v, want 2 TaskRuns adopted", marker.Data)
	}
	// The ended TaskRun may be cleaned already; its Event stays.
	for _, o := range old.userTasks() {
		adoptedEvent(t, o.tr, o.user)
	}
	rec := record(t, berthNS, old.building.tr)
	if rec.Status.Phase != berthv1.PhaseReady || rec.Status.BuildUser != old.building.user || rec.Status.Login == nil || rec.Status.Login.Host != mpcHostName {
		t.Fatalf("the mid-build TaskRun's record: phase %s, user %s, login %+v; want Ready, %s on %s",
			rec.Status.Phase, rec.Status.BuildUser, rec.Status.Login, old.building.user, mpcHostName)
	}
	// berth keeps the task's secret as the upstream controller wrote it, and its user can
	// still log in: the build goes on.
	var s corev1.Secret
	get(t, client.ObjectKeyFromObject(old.building.secret), &s)
	if !bytes.Equal(s.Data["id_rsa"], old.building.secret.Data["id_rsa"]) || len(s.OwnerReferences) > 0 {
		t.Fatal("the mid-build TaskRun's secret was changed")
	}
	loginWorks(t, host, s)
	if now := stacktest.Get(t, admin(), old.building.tr); !controllerutil.ContainsFinalizer(now, contract.Finalizer) {
		t.Fatal("the finalizer of the TaskRun still building was released")
	}
	untouched(t, berthNS, old.provision)
	// The task on a host berth does not know is let go, and left to build with what it has:
	// no slot, no user of berth's.
	event(t, old.elsewhere.tr, "AdoptionFailed", retiredHost)
	eventually(t, old.elsewhere.tr.Name+" is released", func() (bool, error) {
		now := stacktest.Get(t, admin(), old.elsewhere.tr)
		return len(now.Finalizers) == 0 && now.Labels[contract.AssignedHostLabel] == "", nil
	})
	event(t, old.elsewhere.tr, "ForeignSecret", old.elsewhere.secret.Name)
	// A TaskRun its tenant labelled alike, with nothing of the upstream controller's behind
	// it, is not adopted (the marker counts two) but waits as a new task.
	event(t, old.labelled, "AdoptionUnproven", hostops.UpstreamUserName(old.labelled.Namespace, old.labelled.Name))
	if err := admin().Get(context.Background(), client.ObjectKey{Namespace: berthNS, Name: string(old.labelled.UID)}, &berthv1.Allocation{}); err == nil {
		if rec := record(t, berthNS, old.labelled); rec.Status.Message == "adopted from the controller berth replaced" {
			t.Fatalf("%s, labelled by its tenant only, was adopted", old.labelled.Name)
		}
	}
}

// adoptedEnd ends the build still running, as Tekton would, and checks that both adopted
// TaskRuns are released, their records gone and their build users removed from the host.
func adoptedEnd(t *testing.T, berthNS string, host *sshhosts.Host, old upstreamState) {
	t.Helper()
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
			err := admin().Get(context.Background(), client.ObjectKey{Namespace: berthNS, Name: string(o.tr.UID)}, &rec)
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if out, err := host.Run(context.Background(), "if getent passwd "+o.user+" || test -e /home/"+o.user+"; then echo left; fi"); err != nil || out != "" {
			t.Fatalf("the upstream controller's build user %s is still on %s (%q, %v)", o.user, host.Name, out, err)
		}
	}
}

// leftRemoved checks that the upstream controller's task secrets and provision TaskRun are
// gone, but for the secret of the TaskRun still running, and its admin key is still there.
func leftRemoved(t *testing.T, old upstreamState) {
	t.Helper()
	for _, o := range old.userTasks() {
		gone(t, o.secret)
	}
	gone(t, old.provision)
	var still corev1.Secret // its TaskRun still runs
	get(t, client.ObjectKeyFromObject(old.elsewhere.secret), &still)
	var key corev1.Secret
	get(t, client.ObjectKey{Namespace: mpcNamespace, Name: mpcAdminSecret}, &key)
}

// newBuildsSecret waits until berth has handed the new TaskRun its build user on host and
// returns the task's secret, checked to name that user.
func newBuildsSecret(t *testing.T, berthNS string, host *sshhosts.Host, fresh *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	rec := ready(t, berthNS, fresh)
	s := stacktest.SecretOf(t, admin(), fresh)
	if !regexp.MustCompile(`^u-[0-9a-f]{24}-[0-9]+@`+regexp.QuoteMeta(host.Address)+`$`).Match(s.Data["host"]) ||
		!strings.HasPrefix(string(s.Data["host"]), rec.Status.BuildUser+"@") || rec.Status.Login.Host != mpcHostName {
		t.Fatalf("the new TaskRun got host %q (record: %s on %+v)", s.Data["host"], rec.Status.BuildUser, rec.Status.Login)
	}
	return s
}

// afterTheSwitch checks that berth goes on as usual once the steps are done: the new tasks'
// users go when they end, and nothing is owed. The tenant's labelled TaskRun was served as a
// new task once the adopted ones freed the host. Once the task berth could not adopt has
// ended, the step that removes what the upstream controller left, run again, deletes its
// secret.
func afterTheSwitch(t *testing.T, doc runbookDoc, berthNS string, host *sshhosts.Host, tenantNS string, old upstreamState, fresh *pipelinev1.TaskRun) {
	t.Helper()
	ready(t, berthNS, old.labelled)
	for _, tr := range []*pipelinev1.TaskRun{fresh, old.labelled} {
		if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil); err != nil {
			t.Fatal(err)
		}
	}
	// No record, no finalizer and no host for any TaskRun of the namespace, build-elsewhere
	// (still building) included: berth never served it.
	eventually(t, "berth owes nothing for "+tenantNS, func() (bool, error) {
		return owesNothing(berthNS, tenantNS)
	})
	if users, err := host.BuildUsers(context.Background()); err != nil || len(users) > 0 {
		t.Fatalf("build users left on %s: %v (%v)", host.Name, users, err)
	}
	if err := stack.StandIn.Finish(context.Background(), client.ObjectKeyFromObject(old.elsewhere.tr), nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, old.elsewhere.tr.Name+" has ended", func() (bool, error) {
		return stacktest.Get(t, admin(), old.elsewhere.tr).IsDone(), nil
	})
	doc.run(t, "Remove what the upstream controller left")
	gone(t, old.elsewhere.secret)
}

// stopAndShowLog stops berth if it still runs and, if the test failed, logs the end of its
// log.
func stopAndShowLog(t *testing.T, cmd *exec.Cmd, logPath string) {
	if cmd != nil && cmd.ProcessState == nil {
		stopBerth(t, cmd)
	}
	if t.Failed() {
		if out, err := os.ReadFile(logPath); err == nil {
			lines := strings.Split(string(out), "\n")
			t.Logf("%s ends:\n%s", filepath.Base(logPath), strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	}
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
// its Deployments and Services, its host-config and admin key in its namespace, two user TaskRuns with its
// labels, finalizer, secret and build user (one building, one ended), and one of its
// provision TaskRuns; and a TaskRun a tenant labelled alike with nothing behind it.
func leaveWhatUpstreamLeaves(t *testing.T, host *sshhosts.Host, ns string) upstreamState {
	t.Helper()
	ctx := context.Background()
	if err := stack.ControlPlane.EnsureNamespace(ctx, mpcNamespace); err != nil {
		t.Fatal(err)
	}
	upstreamDeployments(t)
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

// upstreamDeployments makes the upstream controller's Deployments and Services as its
// deploy/operator and deploy/otp manifests make them, with the fields of theirs that berth's
// do not set: the controller's probe port named probes and its own ServiceAccount, the key
// server's port 8080 and its certificate's Secret mounted as volume tls, the metrics Service
// that selects the controller's pods.
func upstreamDeployments(t *testing.T) {
	t.Helper()
	one := int32(1)
	deployment := func(name string, c corev1.Container, volumes ...corev1.Volume) *appsv1.Deployment {
		selector := map[string]string{"app": name}
		c.Env = []corev1.EnvVar{{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}
		c.ImagePullPolicy = corev1.PullAlways
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: name},
			Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: selector},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: selector},
					Spec: corev1.PodSpec{ServiceAccountName: "multi-platform-controller-controller-manager",
						Containers: []corev1.Container{c}, Volumes: volumes}}}}
	}
	create(t, deployment(mpcDeployment, corev1.Container{Name: "manager", Image: "quay.io/konflux-ci/multi-platform-controller",
		Args:  []string{"--metrics-bind-address=:8443", "--v=4", "--zap-log-level=4", "--zap-devel=true"},
		Ports: []corev1.ContainerPort{{Name: "probes", ContainerPort: 8081, Protocol: corev1.ProtocolTCP}}}))
	create(t, deployment(mpcOTPServer, corev1.Container{Name: mpcOTPServer, Image: "quay.io/konflux-ci/multi-platform-controller-otp-service",
		Ports:        []corev1.ContainerPort{{Name: "server", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
		VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: "/tls"}}},
		corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "otp-tls-secrets"}}}))
	create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: mpcOTPServer},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": mpcOTPServer},
			Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(8443), Protocol: corev1.ProtocolTCP}}}})
	create(t, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: mpcNamespace, Name: mpcMetricsService,
		Labels: map[string]string{"control-plane": "controller-manager", "app.kubernetes.io/name": mpcDeployment}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": mpcDeployment},
			Ports: []corev1.ServicePort{{Name: "https", Port: 8443, TargetPort: intstr.FromInt32(8443), Protocol: corev1.ProtocolTCP}}}})
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

// noMetrics turns the controller's metrics endpoint off: its certificate is cert-manager's, and
// nothing of the default layout's path scrapes it.
func noMetrics() map[string]string {
	return map[string]string{"--metrics-bind-address": "0", "--metrics-cert-dir": ""}
}

// startBerth runs the built berth controller as a Deployment's container c runs it: its command
// and flags, POD_NAMESPACE ns, under ServiceAccount sa's RBAC. Only the addresses change: the
// webhook where the stack's apiserver calls it (with the certificate it trusts), the health
// probes on a loopback port of their own, and whatever set gives (a flag set to "" is dropped).
// It returns once /readyz answers, as the Deployment's readiness probe asks.
func startBerth(t *testing.T, c corev1.Container, ns, sa, logPath string, set map[string]string) *exec.Cmd {
	t.Helper()
	webhook := stack.Webhook
	with := map[string]string{
		"--webhook-port":     fmt.Sprint(webhook.Port),
		"--webhook-cert-dir": webhook.CertDir,
	}
	maps.Copy(with, set)
	return startProcess(t, "controller", c, ns, sa, logPath, with, "--webhook-host="+webhook.Host)
}

// startProcess runs `berth <command>` with the flags of container c, those in set replaced (or
// dropped, when set to ""), the health probes on a loopback port of their own, and extra
// flags appended; see startBerth.
func startProcess(t *testing.T, command string, c corev1.Container, ns, sa, logPath string, set map[string]string, extra ...string) *exec.Cmd {
	t.Helper()
	if !slices.Equal(c.Command, []string{"berth", command}) {
		t.Fatalf("container %s runs %q, not berth %s", c.Name, c.Command, command)
	}
	health := freeLoopbackAddress(t)
	set = maps.Clone(set)
	set["--health-probe-bind-address"] = health
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
		t.Fatalf("container %s no longer sets %v: this test's changes to its flags need a look", c.Name, slices.Sorted(maps.Keys(set)))
	}
	args = append(args, extra...)
	args = append(args, "--kubeconfig="+serviceAccountKubeconfig(t, ns, sa))
	cmd := exec.Command(berthBin, append([]string{command}, args...)...)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+ns)
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log.Close()
	t.Logf("berth %s %s (log %s)", command, strings.Join(args, " "), logPath)
	eventually(t, "berth "+command+" answers /readyz", func() (bool, error) {
		if cmd.ProcessState != nil {
			return false, fmt.Errorf("berth %s exited", command)
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

// serviceAccountKubeconfig writes a kubeconfig that acts as ServiceAccount sa of namespace ns
// by impersonation, so that berth is held to the RBAC its layout installs.
func serviceAccountKubeconfig(t *testing.T, ns, sa string) string {
	t.Helper()
	cfg, err := clientcmd.Load(stack.ControlPlane.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = "system:serviceaccount:" + ns + ":" + sa
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	// Beside the stack's own: berth outlives the step that starts it.
	path := filepath.Join(filepath.Dir(stack.KubeConfigPath), ns+"."+sa+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
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

// runbookDoc is a section of the runbook's numbered steps, and each step's commands.
type runbookDoc struct {
	section  string
	steps    []string
	commands map[string]string
}

var (
	stepHeading = regexp.MustCompile(`^### ([0-9]+)\. (.+)$`)
	shBlock     = regexp.MustCompile("(?s)```sh\n(.*?)```")
)

// readRunbook reads the numbered steps of the runbook's section (a "## " heading) and the
// first sh block of each.
func readRunbook(t *testing.T, section string) runbookDoc {
	t.Helper()
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, runbook))
	if err != nil {
		t.Fatal(err)
	}
	_, during, ok := strings.Cut(string(data), "\n## "+section+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", runbook, section)
	}
	during, _, _ = strings.Cut(during, "\n## ")
	doc := runbookDoc{section: section, commands: map[string]string{}}
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
				t.Fatalf("%s, %s: step %q is numbered %s, want %s", runbook, section, m[2], m[1], want)
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
	d.runScript(t, step, d.script(t, step))
}

// script is the step's commands as the runbook gives them.
func (d runbookDoc) script(t *testing.T, step string) string {
	t.Helper()
	script, ok := d.commands[step]
	if !ok {
		t.Fatalf("%s, %s has no commands for step %q", runbook, d.section, step)
	}
	return script
}

// runScript runs a step's script; see run.
func (d runbookDoc) runScript(t *testing.T, step, script string) {
	t.Helper()
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

// owesNothing tells that no TaskRun of ns carries berth's finalizer or a host, and that berth,
// in berthNS, keeps no record for any.
func owesNothing(berthNS, ns string) (bool, error) {
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
	if err := admin().List(ctx, &recs, client.InNamespace(berthNS)); err != nil {
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
func untouched(t *testing.T, berthNS string, tr *pipelinev1.TaskRun) {
	t.Helper()
	now := stacktest.Get(t, admin(), tr)
	if now.Labels[contract.AssignedHostLabel] != mpcHostName || now.Labels[contract.TaskTypeLabel] != "provision" || len(now.Finalizers) > 0 {
		t.Fatalf("berth changed the upstream provision TaskRun: labels %v, finalizers %v", now.Labels, now.Finalizers)
	}
	var recs berthv1.AllocationList
	if err := admin().List(context.Background(), &recs, client.InNamespace(berthNS)); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs.Items {
		if rec.Spec.TaskRun.Namespace == mpcNamespace {
			t.Fatalf("berth keeps a record of %s", rec.Spec.TaskRun.Key())
		}
	}
}

// record reads berth's Allocation of a TaskRun (named by its UID, in berth's namespace berthNS).
func record(t *testing.T, berthNS string, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	var rec berthv1.Allocation
	get(t, client.ObjectKey{Namespace: berthNS, Name: string(tr.UID)}, &rec)
	return &rec
}

// ready waits until berth, in namespace berthNS, has handed the task its build user (see
// stacktest.HandedOver) and returns its record.
func ready(t *testing.T, berthNS string, tr *pipelinev1.TaskRun) *berthv1.Allocation {
	t.Helper()
	var rec berthv1.Allocation
	eventually(t, tr.Name+" has its build user", func() (bool, error) {
		err := admin().Get(context.Background(), client.ObjectKey{Namespace: berthNS, Name: string(tr.UID)}, &rec)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return stacktest.HandedOver(context.Background(), admin(), &rec)
	})
	return &rec
}
