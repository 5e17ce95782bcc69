// Package provision is how berth acts on a build host: create a task's build user, remove it,
// check the host. The controller calls a Provisioner and never waits on it: a call starts the
// job (or reports how a started one ended), and Notify brings the controller back when it ends.
// Two implementations: SSH (the default; the controller does the work itself, so admin keys
// never leave its process) and TaskRuns (internal TaskRuns in the controller's namespace, for
// clusters where only pods may reach hosts).
package provision

import (
	"context"
	"time"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
)

// Job is one build user on one host.
type Job struct {
	// ID names the job; calls with the same ID are the same job. One ID per build user: the
	// user's name carries the TaskRun's UID and the attempt.
	ID    string
	Login berthv1.HostLogin
	User  string
	// AuthorizedKey is the public half of the key berth generated for the task; the private
	// half never reaches the host.
	AuthorizedKey []byte
	// Owner is recorded on the host beside the user ("namespace/name uid").
	Owner        string
	SudoCommands []string
	// UIDs is the config's build-uid-range: where a Linux or macOS build user's IDs come from.
	UIDs config.UIDRange
	// Limits bound the build on a Linux host: the host's or its platform's limit keys
	// (config.DefaultBuildLimits when zero).
	Limits config.BuildLimits
	// Wake is what Notify hands back when the job ends (the TaskRun's namespace/name).
	Wake string
}

// Outcome is where a job stands.
type Outcome struct {
	Done    bool
	UserDir string
	Err     error
}

// Health is a host check's answer.
type Health struct {
	Healthy bool
	Reason  string
	// Warning is what the operator should know of a host that takes builds (no systemd, so
	// builds are not bounded as a whole).
	Warning string
}

// Provisioner does the host work. Provision and Clean return at once; a job's outcome stays
// available until Forget.
type Provisioner interface {
	Provision(ctx context.Context, job Job) Outcome
	Clean(ctx context.Context, job Job) Outcome
	// Check tells whether the host takes builds; it blocks up to the check's timeout.
	Check(ctx context.Context, login berthv1.HostLogin) Health
	Forget(id string)
}

// UserLister tells, at once, which of some build users exist on a host. Only a provisioner
// that reaches hosts from the controller's own process has one (SSH): internal TaskRuns cannot
// answer while the controller starts.
type UserLister interface {
	ExistingUsers(ctx context.Context, login berthv1.HostLogin, names []string) ([]string, error)
}

// ListTimeout bounds one ExistingUsers: one short command, so as long as a host check
// (hosts.checkTimeout) and no longer.
const ListTimeout = time.Minute

// Notifier is called with a job's Wake when the job ends.
type Notifier func(wake string)

// DefaultTimeout bounds one job on a host.
const DefaultTimeout = 5 * time.Minute
