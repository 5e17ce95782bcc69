package kueue

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/berth-ci/berth/internal/config"
)

func queueOf(t *testing.T, doc string) ClusterQueue {
	t.Helper()
	queues, err := ReadClusterQueues(strings.NewReader(doc), "test")
	if err != nil {
		t.Fatal(err)
	}
	q, err := Pick(queues, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	return q
}

const synthetic = `
apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata:
  name: a
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata:
  name: q
spec:
  resourceGroups:
  - coveredResources: [linux-s390x, linux-arm64, linux-ppc64le, linux-riscv64, aws-ip, cpu]
    flavors:
    - name: a
      resources:
      - {name: linux-s390x, nominalQuota: 8}
      - {name: linux-arm64, nominalQuota: '5'}
      - {name: linux-ppc64le, nominalQuota: 3}
      - {name: linux-riscv64, nominalQuota: 4}
      - {name: aws-ip, nominalQuota: 1k}
      - {name: cpu, nominalQuota: 2k}
    - name: b
      resources:
      - {name: linux-s390x, nominalQuota: 2}
      - {name: linux-arm64, nominalQuota: "0"}
      - {name: linux-ppc64le, nominalQuota: 0}
      - {name: linux-riscv64, nominalQuota: 0}
      - {name: aws-ip, nominalQuota: 0}
      - {name: cpu, nominalQuota: 0}
`

// synthCaps: s390x static with 6 slots (quota 8+2 above), arm64 on AWS with 20 VMs (quota 5
// below), ppc64le pooled 2 VMs × 4 (quota 3 below), amd64 on AWS with no quota; riscv64 has a
// quota and no platform.
var synthCaps = []Capacity{
	{Platform: "linux/s390x", Strategy: config.StrategyStatic, Tasks: 6, Usable: true},
	{Platform: "linux/arm64", Strategy: config.StrategyDynamic, Tasks: 20, Usable: true, Provider: "aws"},
	{Platform: "linux/ppc64le", Strategy: config.StrategyDynamicPool, Tasks: 8, Usable: true, Provider: "ibmp"},
	{Platform: "linux/amd64", Strategy: config.StrategyDynamic, Tasks: 7, Usable: true, Provider: "aws"},
}

func TestCompareEachWayOfDisagreeing(t *testing.T) {
	rep := Compare(queueOf(t, synthetic), synthCaps)
	checkRows(t, rep, map[string]wantRow{
		"linux-s390x":   {QuotaAbove, "10", 6},
		"linux-arm64":   {QuotaBelow, "5", 20},
		"linux-ppc64le": {QuotaBelow, "3", 8},
		"linux-amd64":   {NoQuota, "", 7},
		"linux-riscv64": {NoPlatform, "4", 0},
		AWSIP:           {QuotaAbove, "1k", 27},
	}, 0)
	rows := rowsOf(rep)
	for name, cost := range map[string]string{
		"linux-s390x":   "up to 4 admitted task(s) wait in berth's queue",
		"linux-arm64":   "15 VM(s) it allows are never launched",
		"linux-ppc64le": "5 slot(s) of its pooled VMs are never used",
		"linux-amd64":   "Kueue never admits a PipelineRun building for linux/amd64",
		"linux-riscv64": "berth fails their tasks",
		AWSIP:           "up to 973 admitted task(s) wait",
	} {
		if !strings.Contains(rows[name].Cost, cost) {
			t.Errorf("%s: cost %q, want it to say %q", name, rows[name].Cost, cost)
		}
	}
	if len(rep.Other) != 1 || rep.Other[0] != "cpu" {
		t.Errorf("not compared %v, want [cpu]", rep.Other)
	}
	// 6 rows and no warning: aws-ip is charged to arm64 and amd64 only, both on AWS.
	if rep.Disagreements() != 6 || len(rep.Warnings) != 0 {
		t.Errorf("%d disagreements, warnings %q; want 6 and none", rep.Disagreements(), rep.Warnings)
	}
}

func TestStaticSlotsLeftIdle(t *testing.T) {
	q := queueOf(t, "kind: ClusterQueue\nmetadata: {name: q}\nspec:\n  resourceGroups:\n  - flavors:\n    - name: a\n      resources:\n      - {name: linux-s390x, nominalQuota: '2'}\n")
	rep := Compare(q, []Capacity{{Platform: "linux/s390x", Strategy: config.StrategyStatic, Tasks: 6, Usable: true}})
	if r := rowsOf(rep)["linux-s390x"]; r.Verdict != QuotaBelow || !strings.Contains(r.Cost, "4 slot(s) of its static hosts stay idle") {
		t.Errorf("%s: %s", r.Verdict, r.Cost)
	}
}

func TestStaticPlatformChargedAnAWSIP(t *testing.T) {
	q := queueOf(t, "kind: ClusterQueue\nmetadata: {name: q}\nspec:\n  cohortName: c\n  resourceGroups:\n  - flavors:\n    - name: a\n      resources:\n      - {name: linux-riscv64, nominalQuota: 2}\n      - {name: aws-ip, nominalQuota: 2}\n")
	rep := Compare(q, []Capacity{{Platform: "linux/riscv64", Strategy: config.StrategyStatic, Tasks: 2, Usable: true}})
	checkRows(t, rep, map[string]wantRow{"linux-riscv64": {Agree, "2", 2}, AWSIP: {Agree, "2", 2}}, 0)
	if len(rep.Warnings) != 2 || !strings.Contains(rep.Warnings[0], "linux/riscv64 is static in this config, yet tekton-kueue charges it an aws-ip") ||
		!strings.Contains(rep.Warnings[1], "cohort c") {
		t.Errorf("warnings %q, want the aws-ip charge and the cohort", rep.Warnings)
	}
}

func TestResourceNames(t *testing.T) {
	for p, want := range map[config.Platform]string{"linux/x86_64": "linux-x86-64", "linux-d160-m2xlarge/arm64": "linux-d160-m2xlarge-arm64", "local": "local"} {
		if got := ResourceName(p); got != want {
			t.Errorf("%s: %s, want %s", p, got, want)
		}
	}
}

func TestBadQuotas(t *testing.T) {
	for doc, want := range map[string]string{
		"nominalQuota: lots":  `resource linux-arm64: nominalQuota: "lots" is not a Kubernetes quantity`,
		"nominalQuota: '-3'":  "resource linux-arm64: nominalQuota: -3 is negative",
		"nominalQuota: null":  "resource linux-arm64: nominalQuota: missing",
		"nominalQuota: [1]":   "resource linux-arm64: nominalQuota:",
		"nominalQuota: 1.5Gi": "",
	} {
		_, err := ReadClusterQueues(strings.NewReader("kind: ClusterQueue\nmetadata: {name: q}\nspec:\n  resourceGroups:\n  - flavors:\n    - name: a\n      resources:\n      - name: linux-arm64\n        "+doc+"\n"), "f.yaml")
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", doc, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "f.yaml: ClusterQueue q: flavor a: ")):
			t.Errorf("%s: error %v, want one naming the file, queue, flavor and %q", doc, err, want)
		}
	}
}

func TestPickNamesTheQueues(t *testing.T) {
	two := "kind: ClusterQueue\nmetadata: {name: a}\n---\nkind: ClusterQueue\nmetadata: {name: b}\n"
	queues, err := ReadClusterQueues(strings.NewReader(two), "f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Pick(queues, "", "f"); err == nil || !strings.Contains(err.Error(), "2 ClusterQueues (a, b); name one with --cluster-queue") {
		t.Errorf("no name among two: %v", err)
	}
	if q, err := Pick(queues, "b", "f"); err != nil || q.Name != "b" {
		t.Errorf("named b: %v %v", q.Name, err)
	}
	if _, err := Pick(nil, "", "f"); err == nil || !strings.Contains(err.Error(), "holds no ClusterQueue") {
		t.Errorf("none: %v", err)
	}
}

func TestImpliedSumsAndLocal(t *testing.T) {
	caps := append([]Capacity{{Platform: "local", Strategy: config.StrategyLocal}, {Platform: "linux/x86_64", Strategy: config.StrategyLocal}}, synthCaps...)
	got := map[string]string{}
	for _, q := range Implied(caps, resource.MustParse("300")) {
		got[q.Resource] = q.Quota.String()
	}
	want := map[string]string{"local": "300", "linux-x86-64": "300", "linux-s390x": "6", "linux-arm64": "20", "linux-ppc64le": "8", "linux-amd64": "7", AWSIP: "27"}
	if len(got) != len(want) {
		t.Errorf("implied %v, want %v", got, want)
	}
	for name, q := range want {
		if got[name] != q {
			t.Errorf("%s: %s, want %s", name, got[name], q)
		}
	}
}
