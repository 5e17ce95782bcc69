package cluster

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SpaceAPI is the API a space is asked for with. Konflux's space service has two: the
// toolchain's SpaceRequest, and the eaas Namespace claim (a Crossplane claim) that Konflux's own
// eaas-provision-space has used instead since Dec 2024.
type SpaceAPI string

const (
	// SpaceAPIAuto takes the one the cluster serves, the claim when it serves both.
	SpaceAPIAuto         SpaceAPI = "auto"
	SpaceAPIClaim        SpaceAPI = "namespace-claim"
	SpaceAPISpaceRequest SpaceAPI = "spacerequest"
)

// SpaceAPIs are the values --api takes.
var SpaceAPIs = []SpaceAPI{SpaceAPIAuto, SpaceAPIClaim, SpaceAPISpaceRequest}

// ParseSpaceAPI reads a SpaceAPI; empty is auto.
func ParseSpaceAPI(s string) (SpaceAPI, error) {
	if s == "" {
		return SpaceAPIAuto, nil
	}
	for _, a := range SpaceAPIs {
		if SpaceAPI(s) == a {
			return a, nil
		}
	}
	names := make([]string, len(SpaceAPIs))
	for i, a := range SpaceAPIs {
		names[i] = string(a)
	}
	return "", fmt.Errorf("unknown space API %q: want one of %s", s, strings.Join(names, ", "))
}

// String names the API as a person reads it, with the resource it is served as.
func (a SpaceAPI) String() string {
	switch a {
	case SpaceAPIClaim:
		return "Namespace claims (" + resourceOf(claimGVK, "namespaces") + ")"
	case SpaceAPISpaceRequest:
		return "SpaceRequests (" + resourceOf(spaceRequestGVK, "spacerequests") + ")"
	}
	return string(a)
}

func resourceOf(gvk schema.GroupVersionKind, plural string) string {
	return plural + "." + gvk.Group + "/" + gvk.Version
}

// ServedAPIs says which of the space APIs the tenant's cluster serves.
type ServedAPIs struct{ Claim, SpaceRequest bool }

// ChooseSpaceAPI picks the API to ask with, and says why: the one asked for, which the cluster
// must serve; with auto, the claim where it is served (as Konflux's own Task asks), else a
// SpaceRequest.
func ChooseSpaceAPI(asked SpaceAPI, served ServedAPIs) (SpaceAPI, string, error) {
	switch asked {
	case SpaceAPIClaim, SpaceAPISpaceRequest:
		if (asked == SpaceAPIClaim && served.Claim) || (asked == SpaceAPISpaceRequest && served.SpaceRequest) {
			return asked, "asked for by name", nil
		}
		return "", "", fmt.Errorf("the cluster does not serve %s; %s", asked, servedNote(served))
	case SpaceAPIAuto, "":
	default:
		return "", "", fmt.Errorf("unknown space API %q", asked)
	}
	switch {
	case served.Claim && served.SpaceRequest:
		return SpaceAPIClaim, "the cluster serves both; auto prefers the claim, which Konflux's eaas-provision-space creates", nil
	case served.Claim:
		return SpaceAPIClaim, "the cluster serves no SpaceRequests", nil
	case served.SpaceRequest:
		return SpaceAPISpaceRequest, "the cluster serves no Namespace claims", nil
	}
	return "", "", fmt.Errorf("the cluster serves neither %s nor %s: is Konflux's space service installed there?", SpaceAPIClaim, SpaceAPISpaceRequest)
}

func servedNote(served ServedAPIs) string {
	switch {
	case served.Claim:
		return "it serves " + SpaceAPIClaim.String() + ": ask with namespace-claim or auto"
	case served.SpaceRequest:
		return "it serves " + SpaceAPISpaceRequest.String() + ": ask with spacerequest or auto"
	}
	return "it serves neither space API: is Konflux's space service installed there?"
}

// servedSpaceAPIs asks the cluster's discovery (through mapper) which space APIs it serves.
func servedSpaceAPIs(mapper meta.RESTMapper) (ServedAPIs, error) {
	served := func(gvk schema.GroupVersionKind) (bool, error) {
		_, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		switch {
		case err == nil:
			return true, nil
		case meta.IsNoMatchError(err):
			return false, nil
		}
		return false, fmt.Errorf("asking the cluster whether it serves %s: %w", gvk, err)
	}
	claim, claimErr := served(claimGVK)
	spaceRequest, spaceRequestErr := served(spaceRequestGVK)
	return ServedAPIs{Claim: claim, SpaceRequest: spaceRequest}, errors.Join(claimErr, spaceRequestErr)
}
