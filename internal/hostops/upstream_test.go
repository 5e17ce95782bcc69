package hostops

import "testing"

// TestUpstreamUserNameIsTheOneItsProvisionTaskMakes: the names below are what the upstream
// controller's provision task computes in its shell, u-$(echo "$TASKRUN_NAME$NAMESPACE" |
// md5sum | cut -b-28), for these TaskRuns; berth must remove exactly those users.
func TestUpstreamUserNameIsTheOneItsProvisionTaskMakes(t *testing.T) {
	for _, tc := range []struct{ namespace, taskRun, want string }{
		{"builds", "left-behind", "u-a0374e67b07dd67d2456ccbc223a"},
		{"user-tenant", "build-x9k2p-build-container-arm64", "u-df4eb0545a33e4065b3e1e7e1575"},
	} {
		got := UpstreamUserName(tc.namespace, tc.taskRun)
		if got != tc.want {
			t.Errorf("UpstreamUserName(%q, %q) = %s, want %s", tc.namespace, tc.taskRun, got, tc.want)
		}
		if !userNameRE.MatchString(got) {
			t.Errorf("%s is not a name berth may remove", got)
		}
		if newUserNameRE.MatchString(got) {
			t.Errorf("%s could be a name berth makes itself", got)
		}
	}
}
