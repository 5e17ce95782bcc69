package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/repo"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
)

// startControlPlane starts a real apiserver and etcd for one test, stopped when it ends.
func startControlPlane(t *testing.T, opts ...controlplane.Option) *controlplane.ControlPlane {
	t.Helper()
	cp, err := controlplane.Start(append([]controlplane.Option{controlplane.WithoutGarbageCollector()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	return cp
}

// berthBinary is bin/berth of `make build`, in $BERTH_BIN_DIR. Without it the test is skipped,
// except in CI (CI=true), where that fails it.
func berthBinary(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(repo.BinDirEnv)
	if dir == "" {
		missing.Skip(t, repo.BinDirEnv+" is not set: run `make build` and set it to bin/, where bin/berth is")
	}
	bin, err := filepath.Abs(filepath.Join(dir, "berth"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		missing.Skip(t, fmt.Sprintf("no executable %s (make build): %v", bin, err))
	}
	return bin
}

// controllerOf finds the Deployment in objs that runs `berth controller`, and that container.
func controllerOf(t *testing.T, objs []*unstructured.Unstructured) (appsv1.Deployment, corev1.Container) {
	t.Helper()
	return runningBerth(t, objs, "controller")
}

// runningBerth finds the Deployment in objs that runs `berth <command>`, and that container.
func runningBerth(t *testing.T, objs []*unstructured.Unstructured, command string) (appsv1.Deployment, corev1.Container) {
	t.Helper()
	var found []string
	var d appsv1.Deployment
	var c corev1.Container
	for _, dep := range ofKind[appsv1.Deployment](t, objs, "Deployment") {
		for _, ctr := range dep.Spec.Template.Spec.Containers {
			if argv := append(slices.Clone(ctr.Command), ctr.Args...); len(argv) > 1 && argv[1] == command {
				d, c = dep, ctr
				found = append(found, dep.Name+"/"+ctr.Name)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one container running `berth %s`, found %v", command, found)
	}
	return d, c
}

// routing is how the controller's process, which runs here rather than in a pod, is reached.
type routing int

const (
	// freePorts: the process listens on free ports in place of the manifest's, since tests run
	// side by side; a Service is reached at 127.0.0.1 on the port standing for its target port,
	// and the apiserver, which has no cluster network to reach a Service through, must be told
	// that address (see registerWebhooks).
	freePorts routing = iota
	// clusterNetwork: the manifest's ports, each Service at its cluster IP, which loopback takes,
	// its ports forwarded to the process's as kube-proxy does; so the apiserver calls a webhook
	// through its Service reference. It changes the machine's network: only in a network
	// namespace of the test's own (inOwnNetwork).
	clusterNetwork
)

// services plays the cluster's Service routing for the controller's process.
type services struct {
	// listen maps each container port of the manifest to the port the process takes instead.
	listen map[int32]int
	// routes maps "<service>.<namespace>.svc:<port>" to where a pod's connection to it goes.
	routes map[string]string
	// names are the DNS names of the Services, which cert-manager's Certificates are for.
	names []string
}

// servicesOf picks the ports of container c's process and routes the Services in objs that
// select d's pods to them, as r says.
func servicesOf(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, d appsv1.Deployment, c corev1.Container, r routing) *services {
	t.Helper()
	s := &services{listen: map[int32]int{}, routes: map[string]string{}}
	byName := map[string]int32{}
	for _, p := range c.Ports {
		byName[p.Name] = p.ContainerPort
		if r == clusterNetwork {
			s.listen[p.ContainerPort] = int(p.ContainerPort)
			continue
		}
		// A port outside the range outgoing connections take theirs from, so that nothing takes
		// it meanwhile.
		addr, err := devstack.MetricsAddress()
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(addr)
		s.listen[p.ContainerPort], _ = strconv.Atoi(port)
	}
	for _, svc := range ofKind[corev1.Service](t, objs, "Service") {
		if svc.Namespace != d.Namespace {
			continue
		}
		ip := "127.0.0.1"
		if r == clusterNetwork {
			var live corev1.Service
			if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(&svc), &live); err != nil {
				t.Fatal(err)
			}
			ip = live.Spec.ClusterIP
			if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
				t.Fatalf("giving loopback Service %s's cluster IP %s: %v: %s", svc.Name, ip, err, out)
			}
		}
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort.IntVal
			if p.TargetPort.Type == intstr.String {
				target = byName[p.TargetPort.StrVal]
			} else if target == 0 {
				target = p.Port
			}
			listen, ok := s.listen[target]
			if !ok {
				continue
			}
			to := net.JoinHostPort(ip, strconv.Itoa(listen))
			if r == clusterNetwork {
				to = net.JoinHostPort(ip, strconv.Itoa(int(p.Port)))
				// The process listens on all addresses: a Service port that is the target port
				// reaches it as it is.
				if p.Port != target {
					forward(t, to, net.JoinHostPort("127.0.0.1", strconv.Itoa(listen)))
				}
			}
			for _, dns := range []string{svc.Name + "." + svc.Namespace + ".svc", svc.Name + "." + svc.Namespace + ".svc.cluster.local"} {
				s.routes[net.JoinHostPort(dns, strconv.Itoa(int(p.Port)))] = to
			}
		}
		s.names = append(s.names, svc.Name+"."+svc.Namespace+".svc", svc.Name+"."+svc.Namespace+".svc.cluster.local")
	}
	return s
}

// dial reaches a Service's address as a pod of the cluster would.
func (s *services) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	to, ok := s.routes[addr]
	if !ok {
		return nil, fmt.Errorf("%s is no Service of the controller's pods", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, to)
}

// forward passes every connection to from on to to, as kube-proxy does for a Service's port,
// until the test ends.
func forward(t *testing.T, from, to string) {
	t.Helper()
	ln, err := net.Listen("tcp", from)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", to)
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(out, in)
					close(done)
				}()
				_, _ = io.Copy(in, out)
				<-done
			}()
		}
	}()
}

// mountedDirs makes a directory for each volume the controller's container mounts and returns
// them by mount path: a Secret's or ConfigMap's as the kubelet would write it, from the object.
// A Secret that does not exist (yet: cert-manager makes it) is filled as cert-manager would
// (tls.crt, tls.key, ca.crt signed by issuer) for the names of the Certificate of that Secret in
// objs, or of the Services when there is none, and for 127.0.0.1, where the apiserver and the
// test reach the process; without an issuer, it fails the test, as the kubelet would not start
// the pod.
func mountedDirs(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, d appsv1.Deployment, c corev1.Container, issuer *tlscerts.CA, svc *services) map[string]string {
	t.Helper()
	root := t.TempDir()
	volumes := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	certNames := map[string][]string{}
	for _, o := range objs {
		if o.GroupVersionKind().Group == "cert-manager.io" && o.GetKind() == "Certificate" {
			secret, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
			names, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "dnsNames")
			certNames[secret] = names
		}
	}
	dirs := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		dir := filepath.Join(root, m.Name)
		switch {
		case !ok:
			t.Fatalf("container %s mounts volume %s, which the pod does not have", c.Name, m.Name)
		case v.Secret != nil:
			var secret corev1.Secret
			err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: d.Namespace, Name: v.Secret.SecretName}, &secret)
			switch {
			case err == nil:
				writeVolume(t, dir, secret.Data, v.Secret.Items)
			case apierrors.IsNotFound(err) && issuer != nil:
				names, ok := certNames[v.Secret.SecretName]
				if !ok {
					names = svc.names
				}
				if _, err := issuer.WriteDir(dir, append([]string{"127.0.0.1"}, names...)...); err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("volume %s: %v", v.Name, err)
			}
		case v.ConfigMap != nil:
			var cm corev1.ConfigMap
			if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: d.Namespace, Name: v.ConfigMap.Name}, &cm); err != nil {
				t.Fatalf("volume %s: %v", v.Name, err)
			}
			files := map[string][]byte{}
			for k, data := range cm.Data {
				files[k] = []byte(data)
			}
			writeVolume(t, dir, files, v.ConfigMap.Items)
		case v.EmptyDir != nil:
			writeVolume(t, dir, nil, nil)
		default:
			t.Fatalf("volume %s of the controller's pod is of a kind this test does not make: %+v", v.Name, v.VolumeSource)
		}
		dirs[m.MountPath] = dir
	}
	return dirs
}

// writeVolume writes files into dir as the kubelet mounts a Secret or ConfigMap: every key, or
// only those items name, at their paths.
func writeVolume(t *testing.T, dir string, files map[string][]byte, items []corev1.KeyToPath) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if len(items) == 0 {
		for k := range files {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		data, ok := files[it.Key]
		if !ok {
			t.Fatalf("the volume at %s has no key %s: the kubelet would not start the pod", dir, it.Key)
		}
		path := filepath.Join(dir, it.Path)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// deployOptions say how runAsDeployed stands in for the cluster around the pod.
type deployOptions struct {
	routing routing
	// issuer, when set, plays cert-manager for the Secrets the pod mounts that do not exist yet
	// (see mountedDirs).
	issuer *tlscerts.CA
	// command is the berth command whose Deployment runs: controller when empty.
	command string
}

// deployedController is bin/berth running as the controller's container.
type deployedController struct {
	svc    *services
	mounts map[string]string // the container's mount path → the directory standing for it
	exited chan struct{}
	err    error // how it exited, once exited is closed
}

// path is where the container's path p is here.
func (r *deployedController) path(p string) string {
	for mount, dir := range r.mounts {
		if p == mount || strings.HasPrefix(p, mount+"/") {
			return dir + strings.TrimPrefix(p, mount)
		}
	}
	return p
}

// checkRunning fails the test if the controller has exited.
func (r *deployedController) checkRunning(t *testing.T) {
	t.Helper()
	select {
	case <-r.exited:
		t.Fatalf("the controller exited: %v", r.err)
	default:
	}
}

// runAsDeployed runs bin/berth as the container of the controller Deployment in objs would
// run, on a control plane where objs are applied: its command and args, its env, acting as its
// ServiceAccount with a token of it; it returns once the process is ready, as its readiness
// probe tells, and stops it when the test ends as the kubelet stops a pod. What a process
// outside a pod needs changed is changed, and said so:
//   - the program: the image's berth is bin/berth, `make build`'s build of the same source;
//   - the mounted Secrets and ConfigMaps: directories holding the same files (mountedDirs);
//   - the ports, as o.routing says;
//   - the credentials: a kubeconfig ($KUBECONFIG) with the ServiceAccount's token and the
//     apiserver's CA, where a pod would have the same in /var/run/secrets/kubernetes.io.
func runAsDeployed(t *testing.T, cp *controlplane.ControlPlane, objs []*unstructured.Unstructured, o deployOptions) *deployedController {
	t.Helper()
	bin := berthBinary(t)
	command := o.command
	if command == "" {
		command = "controller"
	}
	d, c := runningBerth(t, objs, command)
	pod := d.Spec.Template.Spec
	svc := servicesOf(t, cp, objs, d, c, o.routing)
	run := &deployedController{svc: svc, mounts: mountedDirs(t, cp, objs, d, c, o.issuer, svc), exited: make(chan struct{})}

	argv := append(slices.Clone(c.Command), c.Args...)
	if len(argv) == 0 || filepath.Base(argv[0]) != "berth" {
		t.Fatalf("container %s runs %v, not berth", c.Name, argv)
	}
	args := slices.Clone(argv[1:])
	for i, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if !strings.HasPrefix(name, "--") || !ok {
			continue
		}
		value = run.path(value)
		if h, p, err := net.SplitHostPort(value); err == nil {
			if n, err := strconv.Atoi(p); err == nil && svc.listen[int32(n)] != 0 {
				value = net.JoinHostPort(h, strconv.Itoa(svc.listen[int32(n)]))
			}
		} else if n, err := strconv.Atoi(value); err == nil && strings.HasSuffix(name, "-port") && svc.listen[int32(n)] != 0 {
			value = strconv.Itoa(svc.listen[int32(n)])
		}
		if args[i] != name+"="+value {
			t.Logf("%s runs as %s=%s", a, name, value)
			args[i] = name + "=" + value
		}
	}

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, serviceAccountKubeconfig(t, cp, d.Namespace, pod.ServiceAccountName), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(podEnv(t, cp, d, c), "KUBECONFIG="+kubeconfig)

	logPath := filepath.Join(dir, "controller.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, log, log
	// A test binary killed mid-run takes the controller with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the thread that started the child exits, not the process, and a
		// thread ends with any goroutine that locked it and returned (the SSH hosts' and VMs'
		// network namespaces do): once the test's goroutine has left the thread it started the
		// process on, that kills the process. This goroutine holds its thread until the child
		// is gone.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		run.err = cmd.Wait()
		close(run.exited)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	grace := 30 * time.Second
	if s := pod.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(*s) * time.Second
	}
	t.Cleanup(func() {
		// As the kubelet stops a pod: SIGTERM, then SIGKILL after the grace period.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-run.exited:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-run.exited
			t.Errorf("the controller did not stop within its grace period of %s", grace)
		}
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			t.Logf("the controller's log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})

	probe := c.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		t.Fatalf("container %s has no HTTP readiness probe to tell when it is ready", c.Name)
	}
	port := probe.HTTPGet.Port.IntVal
	for _, p := range c.Ports {
		if probe.HTTPGet.Port.Type == intstr.String && p.Name == probe.HTTPGet.Port.StrVal {
			port = p.ContainerPort
		}
	}
	scheme := "http"
	if probe.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	ready := fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, svc.listen[port], probe.HTTPGet.Path)
	// The kubelet does not check a probe's certificate either.
	probes := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	stacktest.Eventually(t, "the controller answers its readiness probe "+ready, func() (bool, error) {
		run.checkRunning(t)
		resp, err := probes.Get(ready)
		if err != nil {
			return false, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("%s: %s", resp.Status, body)
		}
		return true, nil
	})
	return run
}

// serviceAccountKubeconfig asks the apiserver for a token of the ServiceAccount, as the kubelet
// does for a pod, and returns a kubeconfig holding only that token and the apiserver's CA.
func serviceAccountKubeconfig(t *testing.T, cp *controlplane.ControlPlane, namespace, name string) []byte {
	t.Helper()
	if name == "" {
		t.Fatal("the controller's pod names no ServiceAccount: it would run as default, which the install grants nothing")
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	seconds := int64(time.Hour / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of ServiceAccount %s/%s: %v", namespace, name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["apiserver"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["controller"] = &clientcmdapi.Context{Cluster: "apiserver", AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = "controller"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// podEnv is the environment container c of d's pod gets: its env, with the values the kubelet
// fills in from the pod (fieldRef) and from Secrets and ConfigMaps. Nothing of the test's own
// environment is passed on.
func podEnv(t *testing.T, cp *controlplane.ControlPlane, d appsv1.Deployment, c corev1.Container) []string {
	t.Helper()
	if len(c.EnvFrom) > 0 {
		t.Fatalf("container %s takes envFrom, which this test does not fill", c.Name)
	}
	fields := map[string]string{
		"metadata.namespace":      d.Namespace,
		"metadata.name":           d.Name + "-deploy-test",
		"spec.serviceAccountName": d.Spec.Template.Spec.ServiceAccountName,
		"spec.nodeName":           "deploy-test-node",
		"status.podIP":            "127.0.0.1",
		"status.hostIP":           "127.0.0.1",
	}
	var env []string
	for _, e := range c.Env {
		value := e.Value
		if from := e.ValueFrom; from != nil {
			var err error
			switch {
			case from.FieldRef != nil:
				var ok bool
				if value, ok = fields[from.FieldRef.FieldPath]; !ok {
					t.Fatalf("env %s takes field %s, which this test does not fill", e.Name, from.FieldRef.FieldPath)
				}
			case from.SecretKeyRef != nil:
				var s corev1.Secret
				err = cp.Client.Get(context.Background(), client.ObjectKey{Namespace: d.Namespace, Name: from.SecretKeyRef.Name}, &s)
				value = string(s.Data[from.SecretKeyRef.Key])
			case from.ConfigMapKeyRef != nil:
				var cm corev1.ConfigMap
				err = cp.Client.Get(context.Background(), client.ObjectKey{Namespace: d.Namespace, Name: from.ConfigMapKeyRef.Name}, &cm)
				value = cm.Data[from.ConfigMapKeyRef.Key]
			default:
				t.Fatalf("env %s takes a value this test does not fill: %+v", e.Name, from)
			}
			if err != nil {
				t.Fatalf("env %s: %v", e.Name, err)
			}
		}
		env = append(env, e.Name+"="+value)
	}
	return env
}

// ownNetworkEnv tells the test binary it runs in the network namespace inOwnNetwork made.
const ownNetworkEnv = "BERTH_DEPLOY_OWN_NETWORK"

// inOwnNetwork runs the test t again, alone, in a new network namespace with only loopback,
// and reports its outcome as t's; it returns true there, and the caller returns. In that second
// run it brings loopback up and returns false, and the test goes on there: what it does to the
// network (addresses on loopback, the manifest's ports) ends with the namespace. It takes root;
// without, the test is skipped (skipOutsideCI).
func inOwnNetwork(t *testing.T) (parent bool) {
	t.Helper()
	if os.Getenv(ownNetworkEnv) == "1" {
		if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("bringing loopback up: %v: %s", err, out)
		}
		return false
	}
	if os.Geteuid() != 0 {
		missing.Skip(t, "this test runs in a network namespace of its own, which takes root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1", "-test.v=true"}
	if deadline, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(deadline).Round(time.Second).String())
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), ownNetworkEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Should this process die, the kernel kills the second run too; the signal comes when the
	// thread that started it ends, so that thread is kept until the run is over.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	t.Logf("in a network namespace of its own:\n%s", out.String())
	if err != nil {
		t.Fatalf("the run in its own network namespace failed: %v", err)
	}
	if !strings.Contains(out.String(), "--- PASS: "+t.Name()) {
		t.Fatal("the run in its own network namespace did not pass the test")
	}
	return true
}
