package kueue

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// realPair reads a ClusterQueue of ../shared/real/deploy and the host-config of the same
// cluster, as the files are.
func realPair(t *testing.T, queueFile, configFile string) (ClusterQueue, []Capacity) {
	t.Helper()
	dir, err := realdata.Dir()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "deploy", queueFile))
	if err != nil {
		t.Fatal(err)
	}
	queues, err := ReadClusterQueues(bytes.NewReader(raw), queueFile)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Pick(queues, "", queueFile)
	if err != nil {
		t.Fatal(err)
	}
	raw, err = os.ReadFile(filepath.Join(dir, "host-config", configFile))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	cfg, _ := config.Parse(cm.Data)
	return q, Capacities(cfg)
}

type wantRow struct {
	verdict  Verdict
	quota    string // "" for none
	capacity int
}

func rowsOf(rep Report) map[string]Row {
	out := map[string]Row{}
	for _, r := range rep.Rows {
		out[r.Resource] = r
	}
	return out
}

func checkRows(t *testing.T, rep Report, want map[string]wantRow, agreeing int) {
	t.Helper()
	rows := rowsOf(rep)
	for name, w := range want {
		r, ok := rows[name]
		if !ok {
			t.Errorf("%s: no row", name)
			continue
		}
		quota := ""
		if r.Quota != nil {
			quota = r.Quota.String()
		}
		if r.Verdict != w.verdict || quota != w.quota || r.Capacity != w.capacity {
			t.Errorf("%s: %s, quota %q, capacity %d; want %s, quota %q, capacity %d (%s)", name, r.Verdict, quota, r.Capacity, w.verdict, w.quota, w.capacity, r.Cost)
		}
	}
	agree := 0
	for name, r := range rows {
		if _, listed := want[name]; !listed {
			if r.Verdict != Agree {
				t.Errorf("%s: %s (%s), want agree", name, r.Verdict, r.Cost)
			}
			agree++
		}
	}
	if agree != agreeing {
		t.Errorf("%d rows agree, want %d", agree, agreeing)
	}
}

// TestRealStonePrdRh01: production's ClusterQueue gives each AWS platform 250, linux-ppc64le
// 64 and linux-s390x 60, as the rendered config's max-instances (250 each) and static hosts
// (64 and 60 slots) do. It disagrees twice: linux-g4xlarge/amd64, which the config lists with no
// settings, has no quota; and aws-ip is 250 where the 38 usable AWS platforms run 38 × 250 =
// 9500 (39 are charged, linux-g4xlarge/amd64 with capacity 0).
func TestRealStonePrdRh01(t *testing.T) {
	q, caps := realPair(t, "kueue-production-stone-prd-rh01-cluster-queue.yaml", "rendered/production-stone-prd-rh01.yaml")
	rep := Compare(q, caps)
	checkRows(t, rep, map[string]wantRow{
		"linux-g4xlarge-amd64": {NoQuota, "", 0},
		AWSIP:                  {QuotaBelow, "250", 9500},
		"linux-ppc64le":        {Agree, "64", 64},
		"linux-s390x":          {Agree, "60", 60},
		"linux-x86-64":         {Local, "1k", 0},
		"local":                {Local, "1k", 0},
		"localhost":            {Local, "1k", 0},
	}, 38)
	if n := len(rowsOf(rep)[AWSIP].Platforms); n != 39 {
		t.Errorf("aws-ip counts %d platforms, want 39", n)
	}
	if want := []string{"cpu", "konflux-ci-dev-token", "memory", "mintmaker", "tekton.dev/pipelineruns"}; !slices.Equal(rep.Other, want) {
		t.Errorf("not compared: %v, want %v", rep.Other, want)
	}
	if len(rep.Warnings) != 0 || rep.Disagreements() != 2 {
		t.Errorf("warnings %q, %d disagreements; want none and 2", rep.Warnings, rep.Disagreements())
	}
}

// TestRealStaging: stone-stg-rh01 (rendered/staging.yaml, instance tag stone-stg-rh01) agrees
// on every platform, the two static ones at 2 slots; only aws-ip, 250 against 26 × 250 = 6500,
// disagrees.
func TestRealStaging(t *testing.T) {
	q, caps := realPair(t, "kueue-staging-stone-stg-rh01-cluster-queue.yaml", "rendered/staging.yaml")
	rep := Compare(q, caps)
	checkRows(t, rep, map[string]wantRow{
		AWSIP:           {QuotaBelow, "250", 6500},
		"linux-ppc64le": {Agree, "2", 2},
		"linux-s390x":   {Agree, "2", 2},
		"linux-x86-64":  {Local, "1k", 0},
		"local":         {Local, "1k", 0},
		"localhost":     {Local, "1k", 0},
	}, 26)
	if rep.Disagreements() != 1 {
		t.Errorf("%d disagreements, want 1", rep.Disagreements())
	}
}

// TestRealDevelopment: the development cluster's config serves only local platforms
// (linux/amd64 among them), while its queue has 10 for linux-arm64, -ppc64le and -s390x, which
// the config lacks, and no quota for linux-x86-64, local and localhost; linux/amd64, local
// here, is charged an aws-ip.
func TestRealDevelopment(t *testing.T) {
	q, caps := realPair(t, "kueue-development-cluster-queue.yaml", "production/development.host-config.yaml")
	rep := Compare(q, caps)
	checkRows(t, rep, map[string]wantRow{
		"linux-amd64":   {Local, "10", 0},
		"linux-arm64":   {NoPlatform, "10", 0},
		"linux-ppc64le": {NoPlatform, "10", 0},
		"linux-s390x":   {NoPlatform, "10", 0},
		"linux-x86-64":  {NoQuota, "", 0},
		"local":         {NoQuota, "", 0},
		"localhost":     {NoQuota, "", 0},
		AWSIP:           {Local, "250", 0},
	}, 0)
	if len(rep.Warnings) != 1 || !strings.HasPrefix(rep.Warnings[0], "linux/amd64 is local in this config, yet tekton-kueue charges it an aws-ip") {
		t.Errorf("warnings %q, want one that linux/amd64 is charged an aws-ip", rep.Warnings)
	}
	if rep.Disagreements() != 7 {
		t.Errorf("%d disagreements, want 7", rep.Disagreements())
	}
}

// TestRealTektonKueueConfigsChargeAsWeDo reads the CEL of every tekton-kueue config Konflux
// ships: the platforms it exempts from aws-ip, how it names a platform's resource, and the
// resources it names outright must be those this package assumes, so that a change upstream
// fails here rather than skewing every report.
func TestRealTektonKueueConfigsChargeAsWeDo(t *testing.T) {
	dir, err := realdata.Dir()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "deploy", "kueue-*-tekton-kueue-config.yaml"))
	if len(files) != 3 {
		t.Fatalf("want the production, staging and development tekton-kueue configs, found %v", files)
	}
	exempt := regexp.MustCompile(`in \[((?:\s*'[^']*',?)+)\s*\]`)
	quoted := regexp.MustCompile(`'([^']*)'`)
	named := regexp.MustCompile(`resource\('([^']+)'`)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		if n := strings.Count(text, `resource(replace(replace(p, "/", "-"), "_", "-"), 1)`) + strings.Count(text, `resource(replace(replace(p[0].value, "/", "-"), "_", "-"), 1)`); n != 2 {
			t.Errorf("%s: %d platform resources named by replacing / and _ with -, want 2 (build-platforms and PLATFORM)", f, n)
		}
		lists := exempt.FindAllStringSubmatch(text, -1)
		if len(lists) != 2 {
			t.Errorf("%s: %d aws-ip exemption lists, want 2", f, len(lists))
		}
		for _, l := range lists {
			var got []config.Platform
			for _, m := range quoted.FindAllStringSubmatch(l[1], -1) {
				got = append(got, config.Platform(m[1]))
			}
			if !slices.Equal(got, notChargedAWSIP) {
				t.Errorf("%s: exempts %v from aws-ip, this package %v", f, got, notChargedAWSIP)
			}
		}
		for _, m := range named.FindAllStringSubmatch(text, -1) {
			if m[1] != AWSIP && !slices.Contains(otherResources, m[1]) {
				t.Errorf("%s: asks for resource %s, which this package would take for a platform", f, m[1])
			}
		}
	}
}

// TestImpliedQuotasOfStonePrdRh01 prints the quotas the production config implies, reads them
// back as Kueue would, and finds the real queue's own numbers for every platform but
// linux-g4xlarge/amd64 (listed with no settings: 0).
func TestImpliedQuotasOfStonePrdRh01(t *testing.T) {
	real, caps := realPair(t, "kueue-production-stone-prd-rh01-cluster-queue.yaml", "rendered/production-stone-prd-rh01.yaml")
	implied := Implied(caps, resource.MustParse("1k"))
	var out bytes.Buffer
	if err := WriteResourceGroups(&out, implied, "production-stone-prd-rh01", "platform-group-"); err != nil {
		t.Fatal(err)
	}
	doc := "kind: ClusterQueue\nmetadata:\n  name: printed\nspec:\n" + indent(out.String(), "  ")
	queues, err := ReadClusterQueues(strings.NewReader(doc), "printed")
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	printed := queues[0].Quotas
	if len(printed) != 44 {
		t.Errorf("%d resources printed, want the config's 44 platforms", len(printed))
	}
	for name, q := range printed {
		want, ok := real.Quotas[name]
		if name == "linux-g4xlarge-amd64" {
			want, ok = resource.MustParse("0"), true
		}
		if !ok || q.Cmp(want) != 0 {
			t.Errorf("%s: printed %s, the real queue has %s", name, q.String(), want.String())
		}
	}
	if groups := strings.Count(out.String(), "- coveredResources:"); groups != 3 {
		t.Errorf("%d groups for 44 resources, want 3 of at most %d", groups, groupSize)
	}
	if !strings.Contains(out.String(), `# aws-ip: "9500", the tasks the 39 platform(s)`) {
		t.Errorf("no aws-ip comment of 9500 for 39 platforms:\n%s", out.String())
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}
