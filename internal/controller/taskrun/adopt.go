package taskrun

// What the controller berth replaced left of the TaskRuns it served, read as evidence at the
// switch-over: never a tenant's label, finalizer or secret, only what that controller itself
// made where no tenant writes.

import (
	"context"
	"fmt"
	"slices"
	"sync"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/hostops"
)

// DefaultUpstreamNamespace is where the controller berth replaces runs, and with it its
// provision TaskRuns (the contract's Deployments live there).
const DefaultUpstreamNamespace = "multi-platform-controller"

// proof is what shows that the controller berth replaced served a TaskRun on its host: the
// build user it made there ("" when nothing shows it), and what berth saw, for the Event.
type proof struct {
	user string
	seen string
}

// upstreamProvisions maps each user TaskRun to the host addresses that the controller berth
// replaced has a provision TaskRun for, in that controller's namespace (no tenant writes there).
// It names the TaskRun and the host by its params TASKRUN_NAME, NAMESPACE and HOST (an
// address), as its launchProvisioningTask writes them; its script names the user from the
// first two (hostops.UpstreamUserName). That controller deletes a provision TaskRun once it
// succeeded, so most builds have none left: the host's users are asked then (usersOnHosts). A
// failed one proves nothing: that controller took the host off the task and tried another.
func (l *line) upstreamProvisions(ctx context.Context) (map[types.NamespacedName][]string, error) {
	var list pipelinev1.TaskRunList
	if err := l.apiReader.List(ctx, &list, client.InNamespace(l.upstreamNamespace),
		client.MatchingLabels{contract.TaskTypeLabel: contract.TaskTypeProvision}); err != nil {
		return nil, fmt.Errorf("listing the provision TaskRuns of the controller berth replaced in namespace %s: %w", l.upstreamNamespace, err)
	}
	out := map[types.NamespacedName][]string{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.IsDone() && !p.IsSuccessful() {
			continue
		}
		params := map[string]string{}
		for _, param := range p.Spec.Params {
			if param.Value.Type == pipelinev1.ParamTypeString {
				params[param.Name] = param.Value.StringVal
			}
		}
		task := types.NamespacedName{Namespace: params["NAMESPACE"], Name: params["TASKRUN_NAME"]}
		if task.Namespace == "" || task.Name == "" || params["HOST"] == "" {
			continue
		}
		out[task] = append(out[task], params["HOST"])
	}
	return out, nil
}

// prove finds, for each candidate on a host of the config, what shows that the controller berth
// replaced served it there: a provision TaskRun of that controller naming the TaskRun and the
// host's address (the user is then the upstream one), else a build user of the TaskRun's names
// on the host (UpstreamUserName, or LegacyUserName of an earlier berth release; the upstream
// one first, since only the legacy one's 48 bits can be brute-forced onto another's name). The
// hosts are asked once each, whatever the number of candidates.
func (l *line) prove(ctx context.Context, candidates []*pipelinev1.TaskRun, provisions map[types.NamespacedName][]string) map[types.UID]proof {
	proofs := map[types.UID]proof{}
	asks := map[string][]string{} // host name → user names to ask about
	var asked []*pipelinev1.TaskRun
	for _, tr := range candidates {
		host := l.config.Host(tr.Labels[contract.AssignedHostLabel])
		if host == nil {
			continue
		}
		upstream := hostops.UpstreamUserName(tr.Namespace, tr.Name)
		if slices.Contains(provisions[types.NamespacedName{Namespace: tr.Namespace, Name: tr.Name}], host.Address) {
			proofs[tr.UID] = proof{user: upstream, seen: fmt.Sprintf("a provision TaskRun of the controller berth replaced, in namespace %s, made it there", l.upstreamNamespace)}
			continue
		}
		if l.users == nil || config.Platform(host.Platform).OS() == "windows" {
			proofs[tr.UID] = proof{seen: fmt.Sprintf("no provision TaskRun in namespace %s names it, and berth cannot list the users of host %s (a Windows host, or --provisioner=taskrun)", l.upstreamNamespace, host.Name)}
			continue
		}
		asks[host.Name] = append(asks[host.Name], upstream, hostops.LegacyUserName(tr.Namespace, tr.Name))
		asked = append(asked, tr)
	}
	found, failed := l.usersOnHosts(ctx, asks)
	for _, tr := range asked {
		host := tr.Labels[contract.AssignedHostLabel]
		upstream, legacy := hostops.UpstreamUserName(tr.Namespace, tr.Name), hostops.LegacyUserName(tr.Namespace, tr.Name)
		switch {
		case failed[host] != nil:
			proofs[tr.UID] = proof{seen: fmt.Sprintf("no provision TaskRun in namespace %s names it, and the users of host %s could not be listed: %v", l.upstreamNamespace, host, failed[host])}
		case found[host][upstream]:
			proofs[tr.UID] = proof{user: upstream, seen: fmt.Sprintf("its build user %s is on the host", upstream)}
		case found[host][legacy]:
			proofs[tr.UID] = proof{user: legacy, seen: fmt.Sprintf("its build user %s of an earlier berth release is on the host", legacy)}
		default:
			proofs[tr.UID] = proof{seen: fmt.Sprintf("no provision TaskRun in namespace %s names it, and neither %s nor %s is a user of host %s", l.upstreamNamespace, upstream, legacy, host)}
		}
	}
	return proofs
}

// usersOnHosts asks every host of asks, all at once and each in one session (bounded by
// provision.ListTimeout), which of its names are users there. A host that cannot answer has
// its error in failed.
func (l *line) usersOnHosts(ctx context.Context, asks map[string][]string) (found map[string]map[string]bool, failed map[string]error) {
	found, failed = map[string]map[string]bool{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, users := range asks {
		host := l.config.Host(name)
		if host == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			existing, err := l.users.ExistingUsers(ctx, hostconfig.Login(host), users)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed[name] = err
				return
			}
			found[name] = map[string]bool{}
			for _, u := range existing {
				found[name][u] = true
			}
		}()
	}
	wg.Wait()
	return found, failed
}

// claimedBuildUsers counts, for each build user name, the candidates that could own it, under
// either scheme a user was named by before this release: the upstream controller's
// (UpstreamUserName), which runs a TaskRun's name and namespace together, so a tenant can name
// a TaskRun in a namespace of its own ("build-1tea" in "m-ab") to share another tenant's user
// ("build-1" in "team-ab"); and an earlier berth release's (LegacyUserName), whose 48 bits a
// tenant can brute-force onto another's. A user two candidates could own is adopted for
// neither: that would let one task's clean end the other's build.
func claimedBuildUsers(trs []*pipelinev1.TaskRun) map[string]int {
	claims := map[string]int{}
	for _, tr := range trs {
		claims[hostops.UpstreamUserName(tr.Namespace, tr.Name)]++
		claims[hostops.LegacyUserName(tr.Namespace, tr.Name)]++
	}
	return claims
}
