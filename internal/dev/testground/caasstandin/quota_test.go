package caasstandin

import (
	"strings"
	"testing"
)

func newQuota(name string, budget int64, allowed ...allowedTemplate) quota {
	var q quota
	q.Name = name
	q.Spec.Budget = budget
	q.Spec.AllowedTemplates = allowed
	return q
}

func allow(name string, count int64) allowedTemplate {
	return allowedTemplate{Name: name, Count: count}
}

func TestQuotaRefusal(t *testing.T) {
	costs := map[string]int64{"small": 2, "big": 5, "free": 0}
	for _, tc := range []struct {
		name     string
		template string
		quotas   []quota
		existing []string
		want     string // "" for admitted, else words the refusal must hold
	}{
		{"no quota admits anything", "unknown", nil, []string{"small", "small"}, ""},
		{"allowed without count or budget", "small", []quota{newQuota("q", 0, allow("small", 0))}, []string{"small", "small", "small"}, ""},
		{"not allowed", "big", []quota{newQuota("q", 0, allow("small", 0))}, nil, `"big" is not among the allowed templates of ClusterTemplateQuota "q"`},
		{"not allowed by any of two", "big", []quota{newQuota("b", 0, allow("small", 0)), newQuota("a", 0, allow("free", 0))}, nil, `ClusterTemplateQuota "a", "b"`},
		{"allowed by one of two", "big", []quota{newQuota("a", 0, allow("small", 0)), newQuota("b", 0, allow("big", 0))}, nil, ""},
		{"under count", "small", []quota{newQuota("q", 0, allow("small", 2))}, []string{"small", "big"}, ""},
		{"at count", "small", []quota{newQuota("q", 0, allow("small", 2))}, []string{"small", "small"}, `allows 2 instance(s) of cluster template "small"`},
		{"within budget", "big", []quota{newQuota("q", 7, allow("small", 0), allow("big", 0))}, []string{"small"}, ""},
		{"over budget", "big", []quota{newQuota("q", 6, allow("small", 0), allow("big", 0))}, []string{"small"}, `"big" costs 5, and ClusterTemplateQuota "q" in namespace ns has 4 of its budget of 6 left`},
		{"templates the quota does not allow spend none of its budget", "big", []quota{newQuota("q", 5, allow("big", 0)), newQuota("r", 0, allow("small", 0))}, []string{"small", "small"}, ""},
		{"a missing template costs nothing", "gone", []quota{newQuota("q", 1, allow("gone", 0), allow("small", 0))}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := quotaRefusal("ns", tc.template, costs, tc.quotas, tc.existing)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("refusal %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFailureSummaryIsTheLastFatalLine(t *testing.T) {
	if got := failureSummary(installFailureLog); !strings.HasPrefix(got, "Bootstrap failed to complete") {
		t.Errorf("summary %q", got)
	}
	if got := failureSummary("one\nlevel=error msg=two\nthree\n"); got != "two" {
		t.Errorf("summary %q, want the error line", got)
	}
	if got := logTail(strings.Repeat("line\n", 30)); strings.Count(got, "\n") != terminationMessageLines-1 {
		t.Errorf("tail of %d lines", strings.Count(got, "\n")+1)
	}
}
