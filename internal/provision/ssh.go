package provision

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/crypto/ssh"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/remote"
)

// HostSide is what runs on a host over SSH (hostops behind it).
type HostSide interface {
	CreateUser(ctx context.Context, t remote.Target, job Job) (userDir string, err error)
	RemoveUser(ctx context.Context, t remote.Target, platform, user string) error
	Check(ctx context.Context, t remote.Target, platform string) Health
	ExistingUsers(ctx context.Context, t remote.Target, names []string) ([]string, error)
}

// SSH provisions from the controller's own process over SSH: admin keys come from the
// controller's namespace and are never written anywhere.
type SSH struct {
	Host HostSide
	// AdminKey is the private key of an admin-key secret (key id_rsa) of the controller's
	// namespace.
	AdminKey func(ctx context.Context, secret string) (ssh.Signer, error)
	// HostKeys decides which host key a host may present: the pinned one, or the one
	// recorded at first contact.
	HostKeys func(login berthv1.HostLogin) (remote.HostKeys, error)
	jobs     *jobs
	// conns keeps connections to hosts open between jobs.
	conns *remote.Pool
}

// NewSSH returns an SSH provisioner running at most workers host jobs at once.
func NewSSH(host HostSide, adminKey func(context.Context, string) (ssh.Signer, error),
	hostKeys func(berthv1.HostLogin) (remote.HostKeys, error), workers int, notify Notifier) *SSH {
	return &SSH{Host: host, AdminKey: adminKey, HostKeys: hostKeys, jobs: newJobs(workers, notify),
		conns: NewConnections()}
}

// NewConnections is the pool of host connections the SSH provisioner keeps between jobs: up
// to 4 idle connections per host, each for 2 minutes.
func NewConnections() *remote.Pool { return remote.NewPool(2*time.Minute, 4) }

func (s *SSH) target(ctx context.Context, login berthv1.HostLogin) (remote.Target, error) {
	signer, err := s.AdminKey(ctx, login.AdminSecret)
	if err != nil {
		return remote.Target{}, fmt.Errorf("the admin key of host %s: %w", login.Host, err)
	}
	keys, err := s.HostKeys(login)
	if err != nil {
		return remote.Target{}, err
	}
	return remote.Target{Address: login.Address, User: login.AdminUser, Signer: signer, HostKeys: keys, Pool: s.conns}, nil
}

// Provision creates job.User on the host with job's public key.
func (s *SSH) Provision(ctx context.Context, job Job) Outcome {
	return s.jobs.run(ctx, "provision/"+job.ID, job.Wake, nil, func(ctx context.Context) Outcome {
		ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
		t, err := s.target(ctx, job.Login)
		if err != nil {
			return Outcome{Err: err}
		}
		dir, err := s.Host.CreateUser(ctx, t, job)
		return Outcome{UserDir: dir, Err: err}
	})
}

// Clean removes job.User from the host; a user already gone is success. It starts only after
// a provision of the same job has ended.
func (s *SSH) Clean(ctx context.Context, job Job) Outcome {
	return s.jobs.run(ctx, "clean/"+job.ID, job.Wake, []string{"provision/" + job.ID}, func(ctx context.Context) Outcome {
		ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
		t, err := s.target(ctx, job.Login)
		if err != nil {
			return Outcome{Err: err}
		}
		return Outcome{Err: s.Host.RemoveUser(ctx, t, job.Login.Platform, job.User)}
	})
}

// Check logs in and asks the host whether it takes builds.
func (s *SSH) Check(ctx context.Context, login berthv1.HostLogin) Health {
	t, err := s.target(ctx, login)
	if err != nil {
		return Health{Reason: err.Error()}
	}
	return s.Host.Check(ctx, t, login.Platform)
}

// ExistingUsers logs in and asks which of names are users on the host, within ListTimeout.
func (s *SSH) ExistingUsers(ctx context.Context, login berthv1.HostLogin, names []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, ListTimeout)
	defer cancel()
	t, err := s.target(ctx, login)
	if err != nil {
		return nil, err
	}
	return s.Host.ExistingUsers(ctx, t, names)
}

// Forget drops the outcomes of job id.
func (s *SSH) Forget(id string) {
	s.jobs.forget("provision/" + id)
	s.jobs.forget("clean/" + id)
}
