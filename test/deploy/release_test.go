package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/berth-ci/berth/hack/release/ociarchive"
	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// `make release` writes the install file and the image archive of this version, and exactly
// that file installs as docs/install.md says (`kubectl apply --server-side -f`) on a real
// apiserver that has Tekton's, cert-manager's and the Prometheus Operator's CRDs: the file holds
// every piece of berth, in an order plain kubectl can apply, every image pinned as
// <repository>:<version>@<the archive's manifest digest>; the apiserver validates every field
// strictly; applying again changes nothing; the objects fit together; and the production binary,
// run as the file's Deployment says under its ServiceAccount, serves a task on each strategy.
func TestReleaseInstallsOnARealAPIServer(t *testing.T) {
	needImageTools(t)
	rel := makeRelease(t)

	// The digest pinned is the archive's, read from the archive make release left in DIST, not
	// taken from its word: this catches a Makefile that pins one archive and leaves another.
	// The reading itself is hack/release's own (ociarchive), not a second copy of it here:
	// reading an OCI archive is checked once, byte by byte, by ociarchive's tests, and what this
	// test adds is that the release's pieces agree.
	tagged := strings.TrimSuffix(rel.image, "@"+rel.digest)
	if got, err := ociarchive.ManifestDigest(rel.archive, tagged); err != nil || got != rel.digest {
		t.Fatalf("the archive's manifest is %s (%v), make release printed %s", got, err, rel.digest)
	}
	want := fmt.Sprintf("%s:%s@%s", makeImageRepository(t), rel.version, rel.digest)
	if rel.image != want {
		t.Errorf("make release pinned %s, want %s (the Makefile's repository, the version, the archive's digest)", rel.image, want)
	}
	objs := readManifests(t, rel.file)
	checkPinned(t, objs, want)
	checkReleaseHolds(t, objs)
	checkApplyOrder(t, objs)

	ctrllog.SetLogger(logr.Discard()) // envtest's, installing the CRDs
	cp := startControlPlane(t, controlplane.WithCRDObjects(prerequisiteCRDs(t)...))
	applyAll(t, cp, objs)
	checkInstalled(t, cp, objs, want)
	checkCertificatesIssued(t, objs)
	checkClusterTasks(t, cp, rel.clusterTasks, want)
	checkKonfluxFile(t, rel.konflux, want)
	serveOnEachStrategy(t, cp, objs)
}

// checkClusterTasks checks the tenants' Tasks make release wrote beside the install file: every
// Task of config/tasks/cluster, each running the pinned image by its param image's default
// (which kustomize's images entry does not reach), and valid to the apiserver in a tenant's
// namespace (kubectl apply -n <namespace> -f, as the file's header says).
func checkClusterTasks(t *testing.T, cp *controlplane.ControlPlane, path, want string) {
	t.Helper()
	objs := readManifests(t, path)
	tasks := 0
	for _, o := range render(t, clusterTasks) {
		if o.GetKind() == "Task" {
			tasks++
		}
	}
	pinned := 0
	for _, task := range ofKind[pipelinev1.Task](t, objs, "Task") {
		for _, p := range task.Spec.Params {
			if p.Name != "image" {
				continue
			}
			if p.Default == nil {
				t.Errorf("Task %s: param image has no default, want %s", task.Name, want)
			} else if p.Default.StringVal != want {
				t.Errorf("Task %s: param image defaults to %s, want %s", task.Name, p.Default.StringVal, want)
			} else {
				pinned++
			}
		}
	}
	if tasks == 0 || pinned != tasks {
		t.Errorf("%s pins %d Tasks' image, config/tasks/cluster has %d Tasks", filepath.Base(path), pinned, tasks)
	}
	const tenant = "release-cluster-tasks"
	if err := cp.EnsureNamespace(context.Background(), tenant); err != nil {
		t.Fatal(err)
	}
	var inTenant []*unstructured.Unstructured
	for _, o := range objs {
		o = o.DeepCopy()
		if o.GetKind() != "ClusterRole" {
			o.SetNamespace(tenant)
		}
		inTenant = append(inTenant, o)
	}
	applyAll(t, cp, inTenant)
}

// release is what `make release` made.
type release struct {
	version, digest, image      string // the image as the install file pins it
	archive, file, clusterTasks string
	konflux                     string // the Konflux layout's install file
}

// makeRelease runs `make release` into a temporary DIST, as a release is made, and reads what it
// printed. The image it tags is removed afterwards; the archive and the file stay in DIST until
// the test ends.
func makeRelease(t *testing.T) release {
	t.Helper()
	dist := t.TempDir()
	cmd := exec.Command("make", "--no-print-directory", "release", "DIST="+dist)
	cmd.Dir = repoRoot(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("make release: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	printed := map[string]string{}
	for _, line := range strings.Split(stdout.String(), "\n") {
		for _, key := range []string{"image archive", "install file", "cluster tasks", "konflux file", "image"} {
			if v, ok := strings.CutPrefix(line, key+" "); ok && printed[key] == "" {
				printed[key] = strings.TrimSpace(v)
				break
			}
		}
	}
	var r release
	r.archive, r.file, r.clusterTasks, r.konflux, r.image = printed["image archive"], printed["install file"], printed["cluster tasks"], printed["konflux file"], printed["image"]
	m := regexp.MustCompile(`^(.+):([^:/@]+)@(sha256:[0-9a-f]{64})$`).FindStringSubmatch(r.image)
	if m == nil || r.archive == "" || r.file == "" || r.clusterTasks == "" || r.konflux == "" {
		t.Fatalf("make release printed no archive, file, cluster Tasks, Konflux file and pinned image:\n%s", stdout.String())
	}
	r.version, r.digest = m[2], m[3]
	t.Cleanup(func() {
		tagged := strings.TrimSuffix(r.image, "@"+r.digest)
		if out, err := exec.Command("podman", "rmi", tagged).CombinedOutput(); err != nil {
			t.Logf("removing %s: %v: %s", tagged, err, out)
		}
	})
	t.Logf("make release: %s, %s, %s", r.archive, r.file, r.image)

	// The version is what git says this checkout is; the four files are named after it and are
	// all that DIST holds.
	describe, err := exec.Command("git", "-C", repoRoot(t), "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(describe)); r.version != got {
		t.Errorf("make release made version %s; git describe --tags --always --dirty says %s", r.version, got)
	}
	wantFiles := []string{"berth-" + r.version + "-cluster-tasks.yaml", "berth-" + r.version + "-konflux.yaml", "berth-" + r.version + ".oci.tar", "berth-" + r.version + ".yaml"}
	for i, path := range []string{r.clusterTasks, r.konflux, r.archive, r.file} {
		if filepath.Dir(path) != dist || filepath.Base(path) != wantFiles[i] {
			t.Errorf("make release wrote %s, want %s", path, filepath.Join(dist, wantFiles[i]))
		}
	}
	entries, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, wantFiles) {
		t.Errorf("DIST holds %v, want %v", names, wantFiles)
	}
	return r
}

// readManifests reads a multi-document YAML file as kubectl apply -f does.
func readManifests(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var objs []*unstructured.Unstructured
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var m map[string]any
		if err := utilyaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(m) == 0 {
			continue // a comment only
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// checkPinned checks that every image the file runs is want: the controller's containers and
// the steps of berth's Tasks as the image test runs them, and any other image field anywhere,
// so that nothing of the file pulls an image the release did not pin.
func checkPinned(t *testing.T, objs []*unstructured.Unstructured, want string) {
	t.Helper()
	containers := berthContainers(t, objs)
	if len(containers) == 0 {
		t.Fatal("the install file runs no container")
	}
	for _, c := range containers {
		if c.image != want {
			t.Errorf("%s runs %s, want %s", c.where, c.image, want)
		}
	}
	var walk func(where string, v any)
	walk = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, child := range v {
				if s, ok := child.(string); ok && k == "image" && s != want && !strings.HasPrefix(s, "$(") {
					t.Errorf("%s: image %s, want %s", where, s, want)
				}
				walk(where, child)
			}
		case []any:
			for _, child := range v {
				walk(where, child)
			}
		}
	}
	for _, o := range objs {
		walk(key(o), o.Object)
	}
}

// checkReleaseHolds checks that the file has every piece of an installation: every object of
// config/default (CRDs, namespace, RBAC, the controller, its Services, the webhook registration,
// the Tasks), of config/certmanager (the Issuers and Certificates) and of config/prometheus (the
// ServiceMonitor, the PrometheusRule, the metrics reader's binding), and the key server: the
// release turns the OTP option on, so the controller is given --otp-server-url, whose host is a
// Service of the file.
func checkReleaseHolds(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	has := map[string]bool{}
	for _, o := range objs {
		has[key(o)] = true
	}
	for _, dir := range []string{defaultDir, certManagerDir, prometheusDir} {
		for _, o := range render(t, dir) {
			if !has[key(o)] {
				t.Errorf("the install file lacks %s of %s", key(o), dir)
			}
		}
	}
	d, c := controllerOf(t, objs)
	serverURL := flag(c.Args, "otp-server-url")
	if serverURL == "" {
		t.Fatalf("the controller is given no --otp-server-url: task secrets would carry the build user's private key")
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	if name, _, _ := strings.Cut(u.Hostname(), "."); u.Hostname() != name+"."+d.Namespace+".svc" || !has["Service "+d.Namespace+"/"+name] {
		t.Errorf("--otp-server-url=%s names no Service of the file", serverURL)
	}
}

// checkApplyOrder checks that plain `kubectl apply -f` (which applies in the file's order) can
// apply the file: each CRD before any object of its kind, the Namespace before anything in it.
func checkApplyOrder(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	seen := map[string]bool{}
	defined := map[string]bool{} // group/kind of the file's CRDs
	for _, o := range ofKind[apiextensionsv1.CustomResourceDefinition](t, objs, "CustomResourceDefinition") {
		defined[o.Spec.Group+"/"+o.Spec.Names.Kind] = true
	}
	namespaces := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			namespaces[o.GetName()] = true
		}
	}
	for _, o := range objs {
		gk := o.GroupVersionKind().Group + "/" + o.GetKind()
		if defined[gk] && !seen["CRD "+gk] {
			t.Errorf("%s comes before the CRD of its kind", key(o))
		}
		if ns := o.GetNamespace(); namespaces[ns] && !seen["Namespace "+ns] {
			t.Errorf("%s comes before its Namespace", key(o))
		}
		switch o.GetKind() {
		case "CustomResourceDefinition":
			group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
			seen["CRD "+group+"/"+kind] = true
		case "Namespace":
			seen["Namespace "+o.GetName()] = true
		}
	}
}

// checkCertificatesIssued checks that every Secret the controller mounts is one a Certificate of
// the file issues, in the controller's namespace, by an Issuer of the file: with cert-manager
// running, nothing is left to make by hand.
func checkCertificatesIssued(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	d, _ := controllerOf(t, objs)
	issuers := map[string]bool{}
	for _, o := range ofKindUnstructured(objs, "Issuer") {
		issuers[o.GetNamespace()+"/"+o.GetName()] = true
	}
	issued := map[string]bool{}
	for _, c := range ofKindUnstructured(objs, "Certificate") {
		secret, _, _ := unstructured.NestedString(c.Object, "spec", "secretName")
		kind, _, _ := unstructured.NestedString(c.Object, "spec", "issuerRef", "kind")
		name, _, _ := unstructured.NestedString(c.Object, "spec", "issuerRef", "name")
		if kind != "Issuer" || !issuers[c.GetNamespace()+"/"+name] {
			t.Errorf("Certificate %s is issued by %s %s, which the file does not have", c.GetName(), kind, name)
		}
		issued[c.GetNamespace()+"/"+secret] = true
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && !issued[d.Namespace+"/"+v.Secret.SecretName] {
			t.Errorf("the controller mounts Secret %s, which no Certificate of the file issues", v.Secret.SecretName)
		}
	}
}

// prerequisiteCRDs are cert-manager's and the Prometheus Operator's CRDs as their projects
// publish them (hack/crd-modules.txt), read from their Go modules: what a cluster has where
// cert-manager and the operator run.
func prerequisiteCRDs(t *testing.T) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	list, err := os.ReadFile(filepath.Join(repoRoot(t), "hack", "crd-modules.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, line := range strings.Split(string(list), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		dir := moduleDir(t, fields[0])
		for _, pattern := range fields[1:] {
			paths, err := filepath.Glob(filepath.Join(dir, pattern))
			if err != nil || len(paths) == 0 {
				t.Fatalf("%s has no %s (%v)", fields[0], pattern, err)
			}
			for _, path := range paths {
				for _, o := range readManifests(t, path) {
					var crd apiextensionsv1.CustomResourceDefinition
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &crd); err != nil || o.GetKind() != "CustomResourceDefinition" {
						t.Fatalf("%s: %s %s is no CRD (%v)", path, o.GetKind(), o.GetName(), err)
					}
					crds = append(crds, &crd)
				}
			}
		}
	}
	if len(crds) == 0 {
		t.Fatal("hack/crd-modules.txt names no CRD")
	}
	return crds
}

// moduleDir is where the Go module cache holds module@version, downloaded if need be (make
// testbin downloads it beforehand; then this is instant).
func moduleDir(t *testing.T, moduleVersion string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", moduleVersion)
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jsonErr := json.Unmarshal(out, &info); err != nil || jsonErr != nil || info.Dir == "" {
		var stderr []byte
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			stderr = exitErr.Stderr
		}
		t.Fatalf("go mod download -json %s: %v %s %s (make testbin downloads it)", moduleVersion, err, info.Error, stderr)
	}
	return info.Dir
}
