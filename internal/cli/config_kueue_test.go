package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/config/kueue"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// clusterQueueCRD stands in for Kueue's: only kueue.x-k8s.io/v1beta1 is served, with an open
// schema, so that reading the live queue must fall back from v1beta2 as on a cluster with an
// older Kueue.
func clusterQueueCRD() *apiextensionsv1.CustomResourceDefinition {
	open := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "clusterqueues.kueue.x-k8s.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "kueue.x-k8s.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "clusterqueues", Singular: "clusterqueue", Kind: "ClusterQueue", ListKind: "ClusterQueueList"},
			Scope: apiextensionsv1.ClusterScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1beta1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &open}},
			}},
		},
	}
}

func realFile(t *testing.T, rel string) string {
	t.Helper()
	dir, err := realdata.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, rel)
}

const (
	prdQueue  = "deploy/kueue-production-stone-prd-rh01-cluster-queue.yaml"
	prdConfig = "host-config/rendered/production-stone-prd-rh01.yaml"
	stgQueue  = "deploy/kueue-staging-stone-stg-rh01-cluster-queue.yaml"
	stgConfig = "host-config/rendered/staging.yaml"
)

// TestValidateKueueOnStonePrdRh01: the report docs/configuration.md shows, as text and JSON.
func TestValidateKueueOnStonePrdRh01(t *testing.T) {
	out, err := berth(t, "config", "validate", "-f", realFile(t, prdConfig), "--kueue", realFile(t, prdQueue))
	// The config itself lists linux-g4xlarge/amd64 bare: that alone sets the exit code.
	if err == nil || !strings.Contains(err.Error(), "1 platform(s) unusable") {
		t.Errorf("exit: %v", err)
	}
	for _, want := range []string{
		"linux-s390x                linux/s390x                60     60        agree\n",
		"linux-g4xlarge-amd64       linux-g4xlarge/amd64       -      0         no-quota\n",
		"aws-ip                     39 charged                 250    9500      quota-below\n",
		"warning: kueue aws-ip: Kueue admits 250 AWS-charged builds at once, the config's platforms could run 9500",
		"kueue-production-stone-prd-rh01-cluster-queue.yaml: 2 disagreement(s) with the config\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}

	out, _ = berth(t, "config", "validate", "-f", realFile(t, prdConfig), "--kueue", realFile(t, prdQueue), "--json")
	var doc validateDoc
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if doc.Kueue == nil || doc.Kueue.ClusterQueue != "cluster-pipeline-queue" || doc.Kueue.Disagreements != 2 || len(doc.Kueue.Resources) != 45 {
		t.Fatalf("kueue part: %+v", doc.Kueue)
	}
	last := doc.Kueue.Resources[44]
	if last.Resource != "aws-ip" || last.Quota == nil || *last.Quota != "250" || last.Capacity != 9500 || last.Verdict != "quota-below" || len(last.Platforms) != 39 {
		t.Errorf("aws-ip: %+v", last)
	}
}

// TestValidateKueueStrict: staging's config is valid and its queue disagrees only on aws-ip:
// a warning, exit 0, unless --strict.
func TestValidateKueueStrict(t *testing.T) {
	args := []string{"config", "validate", "-f", realFile(t, stgConfig), "--kueue", realFile(t, stgQueue)}
	out, err := berth(t, args...)
	if err != nil || !strings.Contains(out, "1 disagreement(s) with the config") {
		t.Fatalf("without --strict: err=%v\n%s", err, out)
	}
	if _, err := berth(t, append(args, "--strict")...); err == nil || !strings.Contains(err.Error(), "1 disagreement(s) with") {
		t.Fatalf("with --strict: err=%v", err)
	}
	if _, err := berth(t, "config", "validate", "-f", realFile(t, stgConfig)); err != nil {
		t.Fatalf("the same config alone: %v", err)
	}
}

// TestKueueQuotasMatchStaging: what kueue-quotas prints for staging's config, read back as a
// ClusterQueue, gives every platform the real staging queue's quota.
func TestKueueQuotasMatchStaging(t *testing.T) {
	out, err := berth(t, "config", "kueue-quotas", "-f", realFile(t, stgConfig))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var printed struct {
		ResourceGroups []json.RawMessage `json:"resourceGroups"`
	}
	if err := yaml.Unmarshal([]byte(out), &printed); err != nil || len(printed.ResourceGroups) != 2 {
		t.Fatalf("want 2 groups for 31 platforms: %v\n%s", err, out)
	}
	groups, _ := json.Marshal(printed.ResourceGroups)
	got, err := kueue.ParseClusterQueue([]byte(`{"kind":"ClusterQueue","metadata":{"name":"printed"},"spec":{"resourceGroups":` + string(groups) + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(realFile(t, stgQueue))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	queues, err := kueue.ReadClusterQueues(f, stgQueue)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Quotas) != 31 {
		t.Errorf("%d platform quotas printed, want 31", len(got.Quotas))
	}
	for name, q := range got.Quotas {
		if want := queues[0].Quotas[name]; q.Cmp(want) != 0 {
			t.Errorf("%s: printed %s, staging's queue has %s", name, q.String(), want.String())
		}
	}
	if !strings.Contains(out, `# aws-ip: "6500", the tasks the 26 platform(s)`) {
		t.Errorf("no aws-ip of 6500 for 26 platforms:\n%s", out)
	}
}

// TestValidateKueueLive reads the real production queue from the cluster, through the v1beta1
// fallback, and reports what the file does.
func TestValidateKueueLive(t *testing.T) {
	ctx := context.Background()
	raw, err := os.ReadFile(realFile(t, prdQueue))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(raw), "\n---")
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(first), &obj.Object); err != nil {
		t.Fatal(err)
	}
	obj.SetAPIVersion("kueue.x-k8s.io/v1beta1")
	if err := cp.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := berth(t, "config", "validate", "-f", realFile(t, prdConfig), "--kueue-live", "--kubeconfig", kubeconfig)
	if !strings.Contains(out, "Kueue ClusterQueue cluster-pipeline-queue (clusterqueue cluster-pipeline-queue)") ||
		!strings.Contains(out, "clusterqueue cluster-pipeline-queue: 2 disagreement(s) with the config\n") {
		t.Errorf("live report:\n%s", out)
	}
	if _, err := berth(t, "config", "validate", "-f", realFile(t, prdConfig), "--kueue-live", "--cluster-queue", "nope", "--kubeconfig", kubeconfig); err == nil || !strings.Contains(err.Error(), `reading ClusterQueue nope (kueue.x-k8s.io/v1beta1)`) {
		t.Errorf("a missing queue: %v", err)
	}
}
