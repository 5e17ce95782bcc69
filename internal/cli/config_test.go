package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/hostconfig"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	// The real services' CRDs, for the cluster steps' tests; a stand-in for Kueue's
	// ClusterQueue, for validate --kueue-live.
	crds, err := realdata.CRDDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	code := controlplane.RunTestsWith(m, &cp, []controlplane.Option{controlplane.WithCRDs(crds), controlplane.WithCRDObjects(clusterQueueCRD())})
	sshhosts.CloseShared()
	os.Exit(code)
}

// berth runs the CLI in-process with args and returns what it printed and its error.
func berth(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestEverySampleIsValid(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	samples, _ := filepath.Glob(filepath.Join(root, "config", "samples", "host-config-*.yaml"))
	if len(samples) < 4 {
		t.Fatalf("want a sample per strategy (local, static, dynamic, dynamic pool), found %v", samples)
	}
	for _, sample := range samples {
		out, err := berth(t, "config", "validate", "-f", sample)
		if err != nil || !strings.Contains(out, ": valid, every platform usable") {
			t.Errorf("%s: err=%v\n%s", filepath.Base(sample), err, out)
		}
	}
}

func TestBrokenFilePrintsEveryProblemAndFails(t *testing.T) {
	out, err := berth(t, "config", "validate", "-f", filepath.Join("testdata", "broken-config.yaml"))
	if !errors.Is(err, errInvalidConfig) {
		t.Fatalf("want errInvalidConfig (non-zero exit), got %v\n%s", err, out)
	}
	for _, want := range []string{
		"linux/arm64  local     cluster   NO      error: dynamic-platforms: linux/arm64 is also in local-platforms",
		"error: dynamic-platforms: linux/arm64 is also in local-platforms",
		"warning: host.s390x-1.concurency: unknown key; berth ignores it; did you mean concurrency?",
		"error: host.s390x-1.user: missing; it is required: set it to the admin user berth logs in as to create build users; host s390x-1 is left out",
		"error: dynamic.linux-arm64.type: unknown provider type \"asw\"",
		"error: dynamic.linux-arm64.ssh-secret: missing",
		"warning: host.s390x-1.concurrency: not set",
		": 0 of 2 platform(s) usable;",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestWarningsAloneExitZero(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cm.yaml")
	os.WriteFile(path, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  local-platforms: local\n"), 0o600)
	out, err := berth(t, "config", "validate", "-f", path)
	if err != nil || !strings.Contains(out, "warning: metadata.labels") || !strings.Contains(out, "valid, every platform usable (1), with 0 error(s) and 1 warning(s)") {
		t.Fatalf("err=%v\n%s", err, out)
	}
}

// TestValidateRunsTheProvidersChecks: a platform whose provider would refuse its keys (gp3 gives
// 0.25 MiB/s of throughput per IOPS, so 2000 MiB/s needs 8000 IOPS) is unusable at validate,
// as in the controller at load, with the key and the rule; the other platform stays usable.
func TestValidateRunsTheProvidersChecks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cm.yaml")
	aws := func(label string) string {
		return strings.NewReplacer("LABEL", label).Replace(`
  dynamic.LABEL.type: aws
  dynamic.LABEL.region: us-east-1
  dynamic.LABEL.ami: ami-0123456789abcdef0
  dynamic.LABEL.instance-type: m6g.large
  dynamic.LABEL.key-name: builders
  dynamic.LABEL.aws-secret: aws-account
  dynamic.LABEL.ssh-secret: aws-ssh
  dynamic.LABEL.max-instances: "4"`)
	}
	os.WriteFile(path, []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: c, labels: {`+hostconfig.ConfigLabel+`: x}}
data:
  dynamic-platforms: linux/arm64,linux/amd64`+aws("linux-arm64")+`
  dynamic.linux-arm64.iops: "3000"
  dynamic.linux-arm64.throughput: "2000"`+aws("linux-amd64")+`
  dynamic.linux-amd64.iops: "8000"
  dynamic.linux-amd64.throughput: "2000"
`), 0o600)
	out, err := berth(t, "config", "validate", "-f", path)
	if !errors.Is(err, errInvalidConfig) {
		t.Fatalf("want errInvalidConfig (non-zero exit), got %v\n%s", err, out)
	}
	for _, want := range []string{
		"linux/amd64  dynamic   4         yes",
		"linux/arm64  dynamic   0         NO      error: dynamic.linux-arm64.throughput: 2000 MiB/s needs at least 8000 iops",
		"error: dynamic.linux-arm64.throughput: 2000 MiB/s needs at least 8000 iops: gp3 allows 0.25 MiB/s per provisioned IOPS (iops is 3000)\n",
		": 1 of 2 platform(s) usable; 1 error(s), 0 warning(s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "throughput") != 2 {
		t.Errorf("want the problem once in the table and once in the list:\n%s", out)
	}
}

func TestValidateLiveConfigChecksSecrets(t *testing.T) {
	ctx := context.Background()
	ns := "live-validate"
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "hosts", Namespace: ns, Labels: map[string]string{hostconfig.ConfigLabel: "x"}},
		Data: map[string]string{
			"host.a.address": "198.18.1.2", "host.a.user": "root", "host.a.platform": "linux/s390x",
			"host.a.secret": "a-admin", "host.a.concurrency": "2",
			"dynamic-platforms":        "linux/arm64",
			"dynamic.linux-arm64.type": "aws", "dynamic.linux-arm64.region": "us-east-1",
			"dynamic.linux-arm64.ami": "ami-0123456789abcdef0", "dynamic.linux-arm64.instance-type": "m6g.large",
			"dynamic.linux-arm64.key-name": "berth", "dynamic.linux-arm64.aws-secret": "aws-account",
			"dynamic.linux-arm64.ssh-secret": "arm-ssh", "dynamic.linux-arm64.max-instances": "4",
		},
	}
	if err := cp.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := berth(t, "config", "validate", "--kubeconfig", kubeconfig, "-n", ns)
	for _, want := range []string{
		"warning: host.a.secret: secret live-validate/a-admin does not exist; create it with key(s) id_rsa",
		"warning: dynamic.linux-arm64.ssh-secret: secret live-validate/arm-ssh does not exist; create it with key(s) id_rsa",
		// The cloud platform's credentials, named with the Secret and its keys.
		"warning: dynamic.linux-arm64.aws-secret: secret live-validate/aws-account does not exist; create it with key(s) access-key-id, secret-access-key",
	} {
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("want %q\nerr=%v\n%s", want, err, out)
		}
	}

	for name, data := range map[string]map[string][]byte{
		"a-admin": {"id_rsa": []byte("k")}, "arm-ssh": {"id_rsa": []byte("k")},
		"aws-account": {"access-key-id": []byte("AKIAEXAMPLE")},
	} {
		if err := cp.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	out, err = berth(t, "config", "validate", "--kubeconfig", kubeconfig, "-n", ns)
	if err != nil || !strings.Contains(out, "warning: dynamic.linux-arm64.aws-secret: secret live-validate/aws-account has no key secret-access-key") ||
		strings.Contains(out, "does not exist") {
		t.Fatalf("with a credentials key missing: err=%v\n%s", err, out)
	}

	creds := &corev1.Secret{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "aws-account"}, creds); err != nil {
		t.Fatal(err)
	}
	creds.Data["secret-access-key"] = []byte("not-a-real-key")
	if err := cp.Client.Update(ctx, creds); err != nil {
		t.Fatal(err)
	}
	out, err = berth(t, "config", "validate", "--kubeconfig", kubeconfig, "-n", ns)
	if err != nil || !strings.Contains(out, "configmap live-validate/hosts: valid, every platform usable (2)\n") || strings.Contains(out, "not-a-real-key") {
		t.Fatalf("with every secret present: err=%v\n%s", err, out)
	}

	out, err = berth(t, "config", "validate", "--kubeconfig", kubeconfig, "-n", "empty-namespace")
	if err == nil || !strings.Contains(err.Error(), "no ConfigMap in namespace empty-namespace carries the label") {
		t.Fatalf("a namespace without config must fail clearly: err=%v\n%s", err, out)
	}
}

// TestValidateEveryRealConfig runs `berth config validate --json` on every ConfigMap real
// clusters run with: exit 0, but for those that list a platform bare, which exit 1 with only
// those platforms unusable.
func TestValidateEveryRealConfig(t *testing.T) {
	files, err := realdata.HostConfigs()
	if err != nil {
		t.Fatal(err)
	}
	// What ../shared/real/README.md says of the files it names, so that a bareListed that
	// found every platform bare, or none, could not pass.
	known := map[string]string{
		"production/production-downstream-kflux-rhel-p01.host-config.yaml": "linux-g6xlarge/amd64",
		"production/production-downstream-pentest-p01.host-config.yaml":    "linux-g6xlarge/amd64",
		"upstream-examples/deploy_overlays_dev-template_host-config.yaml":  "linux/s390x",
		"rendered/production-kflux-fedora-01.yaml":                         "linux-g4xlarge/amd64,linux-g6xlarge/arm64",
		"rendered/production-downstream-kflux-lw-p01.yaml":                 "",
	}
	bare := map[string]string{}
	for _, f := range files {
		if b := strings.Join(f.BareListed(), ","); b != "" {
			bare[f.Name] = b
		}
		if want, ok := known[f.Name]; ok && bare[f.Name] != want {
			t.Errorf("%s: bare-listed %q, want %q as ../shared/real/README.md says", f.Name, bare[f.Name], want)
		}
	}
	for _, f := range files {
		t.Run(f.Name, func(t *testing.T) {
			out, err := berth(t, "config", "validate", "-f", f.Path, "--json")
			var doc validateDoc
			if jerr := json.NewDecoder(strings.NewReader(out)).Decode(&doc); jerr != nil { // cobra appends the error
				t.Fatalf("not JSON: %v\n%s", jerr, out)
			}
			var unusable []string
			warned := map[string]string{} // key → message of the platforms' warnings
			for _, p := range doc.Platforms {
				if !p.Usable {
					unusable = append(unusable, p.Platform)
				}
				if p.Strategy == "" || p.Problems == nil {
					t.Errorf("platform entry without strategy or problems list: %+v", p)
				}
				for _, pr := range p.Problems {
					if pr.Severity == "warning" {
						warned[pr.Key] = pr.Message
					}
				}
			}
			slices.Sort(unusable)
			// The placeholder ids of this overlay leave its platforms usable, and the operator
			// is told which key holds what.
			if f.Name == "rendered/production-downstream-kflux-lw-p01.yaml" {
				for key, value := range map[string]string{"dynamic.linux-amd64.security-group-id": `"SG_ID"`, "dynamic.linux-arm64.subnet-id": `"SUBNET_ID"`} {
					if !strings.Contains(warned[key], value) {
						t.Errorf("no warning on %s quoting %s: %q", key, value, warned[key])
					}
				}
			}
			want, isBare := bare[f.Name]
			switch {
			case isBare && (err == nil || strings.Join(unusable, ",") != want):
				t.Errorf("want exit 1 with only %s unusable; err=%v, unusable %v", want, err, unusable)
			case !isBare && (err != nil || len(unusable) != 0):
				t.Errorf("want exit 0 with every platform usable; err=%v, unusable %v", err, unusable)
			}
			if len(doc.Platforms) == 0 || doc.Problems == nil {
				t.Errorf("empty verdict: %s", out)
			}
			for _, p := range doc.Problems {
				if p.Severity == "error" {
					t.Errorf("a problem of the whole file: %+v", p)
				}
			}
		})
	}
}

func TestStrictFailsOnALeftOutHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cm.yaml")
	os.WriteFile(path, []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: c, labels: {`+hostconfig.ConfigLabel+`: x}}
data:
  host.a.address: 198.18.1.2
  host.a.user: root
  host.a.platform: linux/s390x
  host.a.secret: a-admin
  host.a.concurrency: "2"
  host.b.address: "198.18.1.3;reboot"
  host.b.user: root
  host.b.platform: linux/s390x
  host.b.secret: a-admin
  host.b.concurrency: "2"
`), 0o600)
	out, err := berth(t, "config", "validate", "-f", path)
	if err != nil || !strings.Contains(out, "linux/s390x  static    2         yes") || !strings.Contains(out, "host b is left out") {
		t.Fatalf("a pool that still serves exits 0 and names the left-out host: err=%v\n%s", err, out)
	}
	if out, err := berth(t, "config", "validate", "-f", path, "--strict"); !errors.Is(err, errInvalidConfig) {
		t.Fatalf("--strict must fail on the left-out host: err=%v\n%s", err, out)
	}
}
