package cluster

import (
	"context"
	"strings"
	"testing"
	"time"
)

// waitFor runs Wait beside the test and hands back its result.
type waitResult struct {
	inst Instance
	err  error
}

func startWait(space *Space, name string, p Polling, progress *log) <-chan waitResult {
	done := make(chan waitResult, 1)
	go func() {
		inst, err := Wait(context.Background(), space, name, p, progress)
		done <- waitResult{inst, err}
	}()
	return done
}

func TestWaitFollowsThePhasesUntilReady(t *testing.T) {
	space, _ := newSpace(t)
	makeInstance(t, space.Namespace, "run", "small")
	setInstance(t, space, "run", "ClusterInstalling", "installing the hosted control plane", nil,
		condition("InstallSucceeded", "False", "ClusterInstalling", "installing"))
	var progress log
	done := startWait(space, "run", fast, &progress)
	eventually(t, "the wait to report the installing phase", func() bool {
		return strings.Contains(progress.String(), "ClusterInstalling: installing the hosted control plane")
	})
	setInstance(t, space, "run", "ClusterSetupRunning", "running the setup", nil,
		condition("InstallSucceeded", "True", "ClusterInstalled", "installed"))
	eventually(t, "the wait to report the setup phase", func() bool {
		return strings.Contains(progress.String(), "ClusterSetupRunning: running the setup")
	})
	setInstance(t, space, "run", "Ready", "", map[string]any{"apiServerURL": "https://api.run.example:6443"},
		condition("InstallSucceeded", "True", "ClusterInstalled", "installed"),
		condition("SetupSucceeded", "True", "SetupSucceeded", "done"),
		condition("Ready", "True", "Ready", "the cluster is ready"))
	r := <-done
	if r.err != nil || !r.inst.Ready() || r.inst.APIServerURL != "https://api.run.example:6443" {
		t.Fatalf("Wait = %+v, %v\n%s", r.inst, r.err, progress.String())
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "[") {
		t.Errorf("want one line per change (installing, setup, ready, done), each with its elapsed time:\n%s", progress.String())
	}
	mustContain(t, "the last line", lines[len(lines)-1], "cluster run is ready: https://api.run.example:6443")
}

func TestWaitFailsAtOnceOnATerminalFailure(t *testing.T) {
	for name, tc := range map[string]struct {
		phase, message string
		conditions     []map[string]any
		want           []string
	}{
		"failure phase": {phase: "ClusterInstallFailed", message: "the install job failed: InsufficientInstanceCapacity",
			conditions: []map[string]any{condition("InstallSucceeded", "False", "InstallFailed", "the install job failed: InsufficientInstanceCapacity")},
			want:       []string{"cluster run failed: phase ClusterInstallFailed: the install job failed: InsufficientInstanceCapacity", "condition InstallSucceeded=False (InstallFailed)"}},
		"credentials": {phase: "CredentialsFailed", message: "cannot read the kubeconfig of the new cluster",
			want: []string{"phase CredentialsFailed: cannot read the kubeconfig of the new cluster"}},
		"failed condition in a running phase": {phase: "ClusterSetupRunning", message: "setting up",
			conditions: []map[string]any{condition("SetupSucceeded", "False", "SetupFailed", "the operator subscription never became ready")},
			want:       []string{"phase ClusterSetupRunning: setting up", "condition SetupSucceeded=False (SetupFailed): the operator subscription never became ready"}},
	} {
		t.Run(name, func(t *testing.T) {
			space, _ := newSpace(t)
			makeInstance(t, space.Namespace, "run", "small")
			setInstance(t, space, "run", tc.phase, tc.message, nil, tc.conditions...)
			// A timeout far beyond the test's patience: only failing fast passes.
			_, err := Wait(context.Background(), space, "run", Polling{Timeout: time.Hour, Interval: fast.Interval}, &log{})
			mustContain(t, "the error", errText(err), tc.want...)
		})
	}
}

func TestWaitTimesOutNamingThePhaseItWasStuckIn(t *testing.T) {
	space, _ := newSpace(t)
	makeInstance(t, space.Namespace, "run", "small")
	setInstance(t, space, "run", "ClusterInstalling", "waiting for nodes", nil)
	_, err := Wait(context.Background(), space, "run", Polling{Timeout: 300 * time.Millisecond, Interval: fast.Interval}, &log{})
	mustContain(t, "the error", errText(err), "cluster run is not ready after 300ms: still in phase ClusterInstalling: waiting for nodes")

	// Phase Ready without its condition is not ready.
	setInstance(t, space, "run", "Ready", "", nil, condition("Ready", "False", "Pending", "credentials not yet written"))
	_, err = Wait(context.Background(), space, "run", Polling{Timeout: 300 * time.Millisecond, Interval: fast.Interval}, &log{})
	mustContain(t, "the error", errText(err), "still in phase Ready", "without a Ready=True condition")
}

func TestWaitFailsForAnInstanceThatDoesNotExist(t *testing.T) {
	space, _ := newSpace(t)
	_, err := Wait(context.Background(), space, "never-made", fast, &log{})
	mustContain(t, "the error", errText(err), "ClusterTemplateInstance "+space.Namespace+"/never-made does not exist")
}
