package provision

import (
	"context"

	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
)

// Hostops is the HostSide of berth's own host operations.
type Hostops struct {
	// MinFreeBytes below which a host fails its check.
	MinFreeBytes uint64
}

// CreateUser creates the job's user with its public key.
func (h Hostops) CreateUser(ctx context.Context, t remote.Target, job Job) (string, error) {
	return hostops.CreateUserOn(ctx, t, job.Login.Platform, hostops.NewUser{Name: job.User, AuthorizedKey: job.AuthorizedKey,
		Owner: job.Owner, SudoCommands: job.SudoCommands, UIDs: job.UIDs, Limits: job.Limits})
}

// RemoveUser removes a build user; one already gone is success.
func (h Hostops) RemoveUser(ctx context.Context, t remote.Target, platform string, user string) error {
	return hostops.CleanOn(ctx, t, platform, user)
}

// Check reports whether the host is reachable and has disk to spare.
func (h Hostops) Check(ctx context.Context, t remote.Target, platform string) Health {
	healthy, reason, warning := hostops.CheckOn(ctx, t, platform, h.MinFreeBytes)
	return Health{Healthy: healthy, Reason: reason, Warning: warning}
}

// ExistingUsers tells which of the build users names exist on the host.
func (h Hostops) ExistingUsers(ctx context.Context, t remote.Target, names []string) ([]string, error) {
	return hostops.ExistingUsers(ctx, t, names)
}
