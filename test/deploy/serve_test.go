package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/ec2fake"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tektonstandin"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
	"github.com/berth-ci/berth/internal/localaffinity"
)

// config/default applied to a real apiserver serves a task on each strategy with the
// production binary run as its Deployment says, under its ServiceAccount (see
// serveOnEachStrategy).
func TestDefaultServesEachStrategy(t *testing.T) {
	needServeParts(t) // at once, before the control plane starts
	cp := startControlPlane(t)
	objs := render(t, defaultDir)
	applyAll(t, cp, objs)
	serveOnEachStrategy(t, cp, objs)
}

// needServeParts skips the test (skipOutsideCI) where bin/berth or what the SSH hosts need is
// missing.
func needServeParts(t *testing.T) {
	t.Helper()
	berthBinary(t)
	if err := sshhosts.Prerequisites(); err != nil {
		missing.Skip(t, fmt.Sprintf("the SSH hosts need %v", err))
	}
}

// The platforms served, one per strategy. One cloud, AWS (through the EC2 API stand-in and the
// real AWS SDK), stands for the dynamic strategy: IBM Z and IBM Power VS differ only in the
// provider berth talks to, which their own tests cover.
const (
	localPlatform   = "linux/x86_64"
	staticPlatform  = "linux/s390x"
	dynamicPlatform = "linux/arm64"
)

// The EC2 account of the stand-in, as an operator configures berth for EC2.
const (
	adminKeySecret = "host-admin-key"  // key id_rsa: root on the static host, ec2-user on the VMs
	awsSecret      = "aws-credentials" // keys access-key-id, secret-access-key
	awsKeyID       = "AKIADEPLOYTESTBERTH01"
	awsRegion      = "us-east-1"
	awsKeyPair     = "berth-deploy-test"
	awsImage       = "ami-0bea7000000000001"
	awsType        = "m6g.large"
)

// serveOnEachStrategy runs the production berth (bin/berth of `make build`) as the controller
// Deployment in objs runs it, its ServiceAccount's token its only credential, on a control plane
// where objs are applied already; then serves a user TaskRun on each strategy: a local platform
// (pinned to nodes of its architecture by berth's webhook, which the apiserver calls), a static
// SSH host and a dynamic platform on EC2, whose VMs are real sshd hosts. Each task gets its
// secret, its build user lets the task in, and once the task ends everything is cleaned up. A
// grant the manifest lacks, a flag the binary refuses or a webhook the apiserver cannot call
// fails it.
func serveOnEachStrategy(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured) {
	t.Helper()
	needServeParts(t)
	ctx := context.Background()
	d, _ := controllerOf(t, objs)
	ns := d.Namespace

	fleet := sshhosts.StartForTest(t, 1)
	host := fleet.Hosts[0]
	cloud, ec2, ec2Secret := startEC2(t, fleet)
	createSecrets(t, cp, ns, map[string]map[string][]byte{
		adminKeySecret: {"id_rsa": fleet.AdminKeyPEM},
		awsSecret:      {"access-key-id": []byte(awsKeyID), "secret-access-key": []byte(ec2Secret)},
	})
	tekton := startTekton(t, cp)

	// What cert-manager would have issued into the Secrets the pod mounts, signed by a CA of
	// the test's (registerWebhooks, playing its CA injector, hands it to the apiserver).
	ca, err := tlscerts.NewCA("deploy test's cert-manager")
	if err != nil {
		t.Fatal(err)
	}
	svc := runAsDeployed(t, cp, objs, deployOptions{routing: freePorts, issuer: ca}).svc
	registerWebhooks(t, cp, objs, ca, svc)

	// The host config, in the upstream controller's keys.
	arm := "dynamic.linux-arm64."
	config := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "host-config", Namespace: ns, Labels: map[string]string{contract.ConfigLabel: "hosts"}},
		Data: map[string]string{
			"local-platforms":   localPlatform,
			"dynamic-platforms": dynamicPlatform,

			"host." + host.Name + ".address":     host.Address,
			"host." + host.Name + ".user":        "root",
			"host." + host.Name + ".platform":    staticPlatform,
			"host." + host.Name + ".secret":      adminKeySecret,
			"host." + host.Name + ".concurrency": "1",

			arm + "type":               "aws",
			arm + "endpoint":           ec2.URL(),
			arm + "region":             awsRegion,
			arm + "ami":                awsImage,
			arm + "instance-type":      awsType,
			arm + "key-name":           awsKeyPair,
			arm + "aws-secret":         awsSecret,
			arm + "ssh-secret":         adminKeySecret,
			arm + "max-instances":      "1",
			arm + "check-interval":     "1",
			arm + "allocation-timeout": "120",
		},
	}
	if err := cp.Client.Create(ctx, config); err != nil {
		t.Fatal(err)
	}
	stacktest.ConfigJudged(t, cp.Client, ns, config.ResourceVersion)

	tenant := "tenant"
	if err := cp.EnsureNamespace(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	served := servedTasks{t: t, cp: cp, tekton: tekton, ns: ns, tenant: tenant, svc: svc}

	t.Run("local", func(t *testing.T) {
		tr := served.create(t, "local", localPlatform)
		amd64 := localaffinity.Node{OS: "linux", Arch: "amd64"}
		if na := localaffinity.Of(tr); !localaffinity.Enforced(na, amd64) {
			t.Fatalf("the TaskRun as created is not pinned to linux/amd64 nodes (the apiserver did not call berth's webhook, or it did not pin): %+v", na)
		}
		secret := served.secret(t, tr)
		if got := string(secret.Data["host"]); got != contract.Localhost {
			t.Fatalf("the secret says host=%q, want %s", got, contract.Localhost)
		}
		pod := served.pod(t, tr)
		if pod.Spec.Affinity == nil || !localaffinity.Enforced(pod.Spec.Affinity.NodeAffinity, amd64) {
			t.Errorf("the task's pod would not be scheduled on a linux/amd64 node: %+v", pod.Spec.Affinity)
		}
		served.finish(t, tr)
	})

	t.Run("static", func(t *testing.T) {
		tr := served.create(t, "static", staticPlatform)
		user, address, signer := served.login(t, tr)
		if address != host.Address {
			t.Fatalf("the task was sent to %s, not the static host %s", address, host.Address)
		}
		served.loggedIn(t, host, user, signer)
		served.finish(t, tr)
		stacktest.Eventually(t, "build user "+user+" is removed from "+host.Name, func() (bool, error) {
			users, err := host.BuildUsers(ctx)
			return err == nil && !slices.Contains(users, user), err
		})
	})

	t.Run("dynamic-aws", func(t *testing.T) {
		tr := served.create(t, "dynamic", dynamicPlatform)
		user, address, signer := served.login(t, tr)
		var vm ec2fake.Instance
		for _, inst := range ec2.Instances() {
			if inst.PrivateIP == address || inst.PublicIP == address {
				vm = inst
			}
		}
		if vm.ID == "" {
			t.Fatalf("the task was sent to %s, which is no instance launched through EC2 (%+v)", address, ec2.Instances())
		}
		machine := cloud.Host(vm.MachineID)
		if machine == nil {
			t.Fatalf("EC2 instance %s has no running machine", vm.ID)
		}
		served.loggedIn(t, machine, user, signer)
		served.finish(t, tr)
		waitCtx, cancel := context.WithTimeout(ctx, stacktest.Patience)
		defer cancel()
		if _, err := cloud.WaitFor(waitCtx, vm.MachineID, vmcloud.Gone); err != nil {
			t.Fatalf("the VM %s was not terminated once its task ended: %v", vm.ID, err)
		}
		if inst, _ := ec2.Instance(vm.ID); inst.State != "terminated" {
			t.Errorf("EC2 shows %s as %s, want terminated", vm.ID, inst.State)
		}
	})
}

// createSecrets creates in ns a Secret of each name holding its data.
func createSecrets(t *testing.T, cp *controlplane.ControlPlane, ns string, secrets map[string]map[string][]byte) {
	t.Helper()
	for name, data := range secrets {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
		if err := cp.Client.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
}

// startEC2 starts the EC2 API stand-in of the test's account (awsKeyID, awsRegion, awsKeyPair,
// awsImage) on a VM cloud whose machines are real sshd hosts that admit fleet's admin key as
// ec2-user. It returns the cloud, the stand-in and the account's secret access key.
func startEC2(t *testing.T, fleet *sshhosts.Fleet) (*vmcloud.Cloud, *ec2fake.Server, string) {
	t.Helper()
	cloud := vmcloud.NewForTest(t, vmcloud.Options{Admin: fleet.AdminSigner, APIKey: randomHex(t, 16), DefaultUser: "ec2-user"})
	secret := randomHex(t, 20)
	ec2 := ec2fake.NewForTest(t, ec2fake.Options{Machines: cloud, AccessKeyID: awsKeyID, SecretAccessKey: secret,
		Region: awsRegion, KeyPairs: []string{awsKeyPair}, Images: []string{awsImage}})
	return cloud, ec2, secret
}

// registerWebhooks does for the webhook configurations of objs what cert-manager's CA injector
// does (the caBundle: the test's CA, unless someone filled it already, as service-ca does on
// OpenShift), and has the apiserver call the controller's process at 127.0.0.1 instead of
// through the Service, which it could only reach through a cluster network this control plane
// does not have.
func registerWebhooks(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, ca *tlscerts.CA, svc *services) {
	t.Helper()
	ctx := context.Background()
	callProcess := func(cc *admissionregistrationv1.WebhookClientConfig) {
		s := cc.Service
		if s == nil {
			t.Fatalf("a webhook of berth's calls %v, not a Service", cc.URL)
		}
		port := int32(443)
		if s.Port != nil {
			port = *s.Port
		}
		to, ok := svc.routes[net.JoinHostPort(s.Name+"."+s.Namespace+".svc", strconv.Itoa(int(port)))]
		if !ok {
			t.Fatalf("the webhook calls Service %s/%s port %d, which does not reach a port of the controller", s.Namespace, s.Name, port)
		}
		u := "https://" + to
		if s.Path != nil {
			u += *s.Path
		}
		cc.Service, cc.URL = nil, &u
		if len(cc.CABundle) == 0 {
			cc.CABundle = ca.PEM
		}
	}
	n := 0
	for _, o := range objs {
		var live client.Object
		switch o.GetKind() {
		case "MutatingWebhookConfiguration":
			live = &admissionregistrationv1.MutatingWebhookConfiguration{}
		case "ValidatingWebhookConfiguration":
			live = &admissionregistrationv1.ValidatingWebhookConfiguration{}
		default:
			continue
		}
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: o.GetName()}, live); err != nil {
			t.Fatal(err)
		}
		switch live := live.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			for i := range live.Webhooks {
				callProcess(&live.Webhooks[i].ClientConfig)
			}
			n += len(live.Webhooks)
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			for i := range live.Webhooks {
				callProcess(&live.Webhooks[i].ClientConfig)
			}
			n += len(live.Webhooks)
		}
		if err := cp.Client.Update(ctx, live); err != nil {
			t.Fatal(err)
		}
	}
	if n == 0 {
		t.Fatal("the manifests register no webhook: local platforms would never be pinned")
	}
}

// startTekton runs the Tekton stand-in, which resolves TaskRuns (status.taskSpec), makes their
// pods and ends them when told (this control plane has no Tekton controller).
func startTekton(t *testing.T, cp *controlplane.ControlPlane) *tektonstandin.StandIn {
	t.Helper()
	ctrl.SetLogger(logr.Discard()) // the stand-in's; berth's own log is the process's
	s := tektonstandin.New(tektonstandin.Options{Scheme: controlplane.Scheme(), WorkDir: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx, cp.Config) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("tekton stand-in: %v", err)
		}
	})
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("tekton stand-in: %v", err)
	}
	return s
}

// servedTasks creates user TaskRuns as the contract says and follows them to their end.
type servedTasks struct {
	t      *testing.T
	cp     *controlplane.ControlPlane
	tekton *tektonstandin.StandIn
	ns     string // the controller's
	tenant string
	svc    *services
}

// create makes a user TaskRun: a PLATFORM param and a step that mounts the task's secret. It
// returns it as the apiserver admitted it.
func (s servedTasks) create(t *testing.T, name, platform string) *pipelinev1.TaskRun {
	t.Helper()
	optional := false
	tr := &pipelinev1.TaskRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.tenant},
		Spec: pipelinev1.TaskRunSpec{
			Params: pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(platform)}},
			TaskSpec: &pipelinev1.TaskSpec{
				Steps: []pipelinev1.Step{{Name: "build", Image: "quay.io/buildah/stable",
					VolumeMounts: []corev1.VolumeMount{{Name: "ssh", MountPath: "/ssh", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ssh", VolumeSource: corev1.VolumeSource{
					Secret: &corev1.SecretVolumeSource{SecretName: contract.SecretPrefix + name, Optional: &optional}}}},
			},
		},
	}
	if err := s.cp.Client.Create(context.Background(), tr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() { // free what it holds for the strategies after it
			_ = s.tekton.Finish(context.Background(), client.ObjectKeyFromObject(tr), nil)
		}
	})
	return tr
}

// secret waits for the task's secret and fails on an error secret.
func (s servedTasks) secret(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Secret {
	t.Helper()
	secret := stacktest.SecretOf(t, s.cp.Client, tr)
	if msg, failed := secret.Data["error"]; failed {
		t.Fatalf("%s got an error secret: %s", tr.Name, msg)
	}
	return secret
}

// pod waits for the task's pod.
func (s servedTasks) pod(t *testing.T, tr *pipelinev1.TaskRun) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	stacktest.Eventually(t, "the pod of "+tr.Name+" exists", func() (bool, error) {
		name := stacktest.Get(t, s.cp.Client, tr).Status.PodName
		if name == "" {
			return false, nil
		}
		err := s.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: tr.Namespace, Name: name}, &pod)
		return err == nil, client.IgnoreNotFound(err)
	})
	return &pod
}

// login reads from the task's secret what the task logs in with: the build user, the host's
// address and the user's key (in the secret, or redeemed once at the key server with the
// secret's one-time token).
func (s servedTasks) login(t *testing.T, tr *pipelinev1.TaskRun) (user, address string, signer ssh.Signer) {
	t.Helper()
	secret := s.secret(t, tr)
	user, address, ok := strings.Cut(string(secret.Data["host"]), "@")
	if !ok {
		t.Fatalf("the secret's host is %q, not user@address", secret.Data["host"])
	}
	key := secret.Data["id_rsa"]
	if token, ok := secret.Data["otp"]; ok {
		key = s.redeem(t, secret, token)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatalf("the task's key: %v", err)
	}
	return user, address, signer
}

// redeem trades a one-time token for the key at the key server the secret names, as the task
// does: checked against the secret's CA, reached through the key server's Service.
func (s servedTasks) redeem(t *testing.T, secret *corev1.Secret, token []byte) []byte {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(secret.Data["otp-ca"]) {
		t.Fatalf("the secret's otp-ca holds no certificate: %q", secret.Data["otp-ca"])
	}
	server, err := url.Parse(string(secret.Data["otp-server"]))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     s.svc.dial,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: server.Hostname()},
	}}
	resp, err := c.Post(server.String(), "text/plain", bytes.NewReader(token))
	if err != nil {
		t.Fatalf("redeeming the one-time token at %s: %v", server, err)
	}
	defer resp.Body.Close()
	key, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("redeeming the one-time token at %s: %s %s (%v)", server, resp.Status, key, err)
	}
	return key
}

// loggedIn logs in to h as the task's build user with its key.
func (s servedTasks) loggedIn(t *testing.T, h *sshhosts.Host, user string, signer ssh.Signer) {
	t.Helper()
	out, err := h.RunAs(context.Background(), user, signer, "id -un")
	if err != nil {
		t.Fatalf("logging in to %s as %s with the task's key: %v", h.Name, user, err)
	}
	if got := strings.TrimSpace(out); got != user {
		t.Fatalf("logged in to %s as %s, the host says %q", h.Name, user, got)
	}
}

// finish ends the task as Tekton would once its steps have run, and waits until berth is done
// with it: its finalizer released and its record gone.
func (s servedTasks) finish(t *testing.T, tr *pipelinev1.TaskRun) {
	t.Helper()
	ctx := context.Background()
	if err := s.tekton.Finish(ctx, client.ObjectKeyFromObject(tr), nil); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, "berth is done with "+tr.Name, func() (bool, error) {
		now := stacktest.Get(t, s.cp.Client, tr)
		if slices.Contains(now.Finalizers, contract.Finalizer) {
			return false, errors.New("the finalizer is still there")
		}
		var rec berthv1.Allocation
		err := s.cp.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: string(tr.UID)}, &rec)
		if err == nil {
			return false, fmt.Errorf("its record is still there: %s %q", rec.Status.Phase, rec.Status.Message)
		}
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
