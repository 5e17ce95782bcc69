package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/berth-ci/berth/internal/config"
)

// The handler's answers to TaskRuns as the apiserver sends them (raw JSON), with the patch
// applied as the apiserver applies it. The stack tests (internal/controller/taskrun) show the
// same through a real apiserver; here are the shapes a test there cannot easily make.

func localConfig(t *testing.T) ConfigSource {
	t.Helper()
	cfg, problems := config.Parse(map[string]string{"local-platforms": "linux/x86_64,local"})
	if len(cfg.Fatal()) > 0 {
		t.Fatal(problems.Summary())
	}
	return func(context.Context) (*config.Config, error) { return cfg, nil }
}

const pinnedAMD64 = `{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[` +
	`{"key":"kubernetes.io/arch","operator":"In","values":["amd64"]},{"key":"kubernetes.io/os","operator":"In","values":["linux"]}]}]}}`

func taskRunJSON(platform, spec string) string {
	return `{"apiVersion":"tekton.dev/v1","kind":"TaskRun","metadata":{"name":"build","namespace":"team"},` +
		`"spec":{"params":[{"name":"PLATFORM","value":"` + platform + `"}],"taskRef":{"name":"buildah"},"aFieldOfANewerTekton":{"kept":true}` + spec + `}}`
}

func TestHandlePatchesOnlyTheNodeAffinity(t *testing.T) {
	for _, tc := range []struct {
		name, spec, want string
	}{
		{"no pod template", ``, taskRunJSON("linux/x86_64", `,"podTemplate":{"affinity":{"nodeAffinity":`+pinnedAMD64+`}}`)},
		{"null pod template", `,"podTemplate":null`, taskRunJSON("linux/x86_64", `,"podTemplate":{"affinity":{"nodeAffinity":`+pinnedAMD64+`}}`)},
		{"pod template without affinity", `,"podTemplate":{"nodeSelector":{"disk":"ssd"},"schedulerName":"fancy"}`,
			taskRunJSON("linux/x86_64", `,"podTemplate":{"nodeSelector":{"disk":"ssd"},"schedulerName":"fancy","affinity":{"nodeAffinity":`+pinnedAMD64+`}}`)},
		{"pod anti-affinity only", `,"podTemplate":{"affinity":{"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"podAffinityTerm":{"topologyKey":"kubernetes.io/hostname"}}]}}}`,
			taskRunJSON("linux/x86_64", `,"podTemplate":{"affinity":{"nodeAffinity":`+pinnedAMD64+`,"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"podAffinityTerm":{"topologyKey":"kubernetes.io/hostname"}}]}}}`)},
		{"a term of its own", `,"podTemplate":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}]}}}}`,
			taskRunJSON("linux/x86_64", `,"podTemplate":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[`+
				`{"key":"zone","operator":"In","values":["a"]},{"key":"kubernetes.io/arch","operator":"In","values":["amd64"]},{"key":"kubernetes.io/os","operator":"In","values":["linux"]}]}]}}}}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := taskRunJSON("linux/x86_64", tc.spec)
			before := testutil.ToFloat64(requests.WithLabelValues(OutcomePinned))
			resp := (&Affinity{Config: localConfig(t)}).Handle(context.Background(), request(in))
			if !resp.Allowed || len(resp.Patches) == 0 {
				t.Fatalf("want an allowed, patched answer: %+v", resp)
			}
			patch, err := json.Marshal(resp.Patches)
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := jsonpatchapply.DecodePatch(patch)
			if err != nil {
				t.Fatal(err)
			}
			out, err := decoded.Apply([]byte(in))
			if err != nil {
				t.Fatalf("applying %s: %v", patch, err)
			}
			if !jsonEqual(t, out, []byte(tc.want)) {
				t.Errorf("patched TaskRun:\n%s\nwant\n%s", out, tc.want)
			}
			if got := testutil.ToFloat64(requests.WithLabelValues(OutcomePinned)); got != before+1 {
				t.Errorf("pinned counted %v times, want once", got-before)
			}
		})
	}
}

func TestHandleAdmitsUnchanged(t *testing.T) {
	panics := ConfigSource(func(context.Context) (*config.Config, error) { panic("a bug") })
	fails := ConfigSource(func(context.Context) (*config.Config, error) { return nil, errors.New("apiserver unreachable") })
	none := ConfigSource(func(context.Context) (*config.Config, error) { return nil, nil })
	for _, tc := range []struct {
		name    string
		source  ConfigSource
		object  string
		outcome string
	}{
		{"pinned already", localConfig(t), taskRunJSON("linux/x86_64", `,"podTemplate":{"affinity":{"nodeAffinity":`+pinnedAMD64+`}}`), OutcomeUnchanged},
		{"not a local platform", localConfig(t), taskRunJSON("linux/s390x", ""), OutcomeUnchanged},
		{"local names no node", localConfig(t), taskRunJSON("local", ""), OutcomeUnchanged},
		{"no config yet", none, taskRunJSON("linux/x86_64", ""), OutcomeNoConfig},
		{"config unreadable", fails, taskRunJSON("linux/x86_64", ""), OutcomeError},
		{"a panic", panics, taskRunJSON("linux/x86_64", ""), OutcomeError},
		{"not a TaskRun", localConfig(t), `{"spec":{"params":"PLATFORM"}}`, OutcomeError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(requests.WithLabelValues(tc.outcome))
			resp := (&Affinity{Config: tc.source}).Handle(context.Background(), request(tc.object))
			if !resp.Allowed || len(resp.Patches) > 0 {
				t.Errorf("want the TaskRun admitted unchanged: %+v", resp)
			}
			if got := testutil.ToFloat64(requests.WithLabelValues(tc.outcome)); got != before+1 {
				t.Errorf("outcome %s counted %v times, want once", tc.outcome, got-before)
			}
		})
	}
}

func request(object string) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(object)},
	}}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return equality.Semantic.DeepEqual(x, y)
}
