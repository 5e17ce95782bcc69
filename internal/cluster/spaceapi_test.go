package cluster

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestChooseSpaceAPI(t *testing.T) {
	var (
		both      = ServedAPIs{Claim: true, SpaceRequest: true}
		claimOnly = ServedAPIs{Claim: true}
		srOnly    = ServedAPIs{SpaceRequest: true}
		none      = ServedAPIs{}
	)
	for _, tc := range []struct {
		asked  SpaceAPI
		served ServedAPIs
		want   SpaceAPI
		// says is what the reason (or the error, when want is "") must say.
		says string
	}{
		{SpaceAPIAuto, both, SpaceAPIClaim, "prefers the claim"},
		{"", both, SpaceAPIClaim, "prefers the claim"},
		{SpaceAPIAuto, claimOnly, SpaceAPIClaim, "no SpaceRequests"},
		{SpaceAPIAuto, srOnly, SpaceAPISpaceRequest, "no Namespace claims"},
		{SpaceAPIAuto, none, "", "serves neither"},
		{SpaceAPIClaim, both, SpaceAPIClaim, "asked for"},
		{SpaceAPISpaceRequest, both, SpaceAPISpaceRequest, "asked for"},
		{SpaceAPIClaim, srOnly, "", "does not serve Namespace claims (namespaces.eaas.konflux-ci.dev/v1alpha1); it serves SpaceRequests"},
		{SpaceAPISpaceRequest, claimOnly, "", "does not serve SpaceRequests (spacerequests.toolchain.dev.openshift.com/v1alpha1); it serves Namespace claims"},
		{SpaceAPIClaim, none, "", "serves neither"},
		{"crossplane", both, "", "unknown space API"},
	} {
		got, why, err := ChooseSpaceAPI(tc.asked, tc.served)
		if tc.want == "" {
			mustContain(t, "the error of "+string(tc.asked), errText(err), tc.says)
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q with %+v: %q, %v; want %q", tc.asked, tc.served, got, err, tc.want)
		}
		mustContain(t, "the reason", why, tc.says)
	}
}

func TestParseSpaceAPI(t *testing.T) {
	for in, want := range map[string]SpaceAPI{"": SpaceAPIAuto, "auto": SpaceAPIAuto, "namespace-claim": SpaceAPIClaim, "spacerequest": SpaceAPISpaceRequest} {
		if got, err := ParseSpaceAPI(in); err != nil || got != want {
			t.Errorf("ParseSpaceAPI(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := ParseSpaceAPI("SpaceRequest")
	mustContain(t, "the error", errText(err), `"SpaceRequest"`, "auto, namespace-claim, spacerequest")
}

// What is served is what discovery (the RESTMapper) knows: an API it has no mapping of is not
// served.
func TestServedSpaceAPIsAsksDiscovery(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{spaceRequestGVK.GroupVersion()})
	mapper.Add(spaceRequestGVK, meta.RESTScopeNamespace)
	if got, err := servedSpaceAPIs(mapper); err != nil || got != (ServedAPIs{SpaceRequest: true}) {
		t.Errorf("a mapper of SpaceRequests only: %+v, %v", got, err)
	}
	// The test control plane serves both, as Konflux's clusters do.
	if got, err := servedSpaceAPIs(kube.RESTMapper()); err != nil || got != (ServedAPIs{Claim: true, SpaceRequest: true}) {
		t.Errorf("the control plane: %+v, %v", got, err)
	}
}
