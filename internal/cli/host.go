package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"golang.org/x/crypto/ssh"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/hostkeys"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
)

func newHostCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "The steps of berth's provision, clean and update TaskRuns, run against one host over SSH",
	}
	cmd.AddCommand(newHostProvisionCommand(), newHostCleanCommand(), newHostUpdateCommand())
	cmd.AddCommand(newHostDrainCommand(), newHostUndrainCommand(), newHostForgetCommand())
	return cmd
}

// hostFlags are what every host step needs to log in as the host's admin user.
type hostFlags struct {
	host, user, keyFile, hostKey, knownHostsNamespace, kubeconfig string
	dialTimeout                                                   time.Duration
}

func (f *hostFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.host, "host", "", "the host's address (HOST), with :port unless 22")
	cmd.Flags().StringVar(&f.user, "user", "", "the host's admin user (USER)")
	cmd.Flags().StringVar(&f.keyFile, "ssh-key-file", "/ssh/id_rsa", "the admin user's private key (the ssh workspace's id_rsa)")
	cmd.Flags().StringVar(&f.hostKey, "host-key", "", "the host's pinned SSH key; empty records the first key seen and accepts only it afterwards")
	cmd.Flags().StringVar(&f.knownHostsNamespace, "known-hosts-namespace", defaultNamespace(), "namespace of the ConfigMap "+hostkeys.ConfigMapName)
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().DurationVar(&f.dialTimeout, "dial-timeout", remote.DefaultDialTimeout, "how long to wait for the host to answer")
	_ = cmd.MarkFlagRequired("host")
	_ = cmd.MarkFlagRequired("user")
}

// login reaches the cluster and builds the host login: the admin key and the host key policy
// (pinned, or the key recorded at first contact).
func (f *hostFlags) login() (client.Client, remote.Target, []byte, error) {
	c, err := kubeClient(f.kubeconfig)
	if err != nil {
		return nil, remote.Target{}, nil, err
	}
	target, key, err := f.target(c)
	return c, target, key, err
}

func (f *hostFlags) target(c client.Client) (remote.Target, []byte, error) {
	keyPEM, err := os.ReadFile(f.keyFile)
	if err != nil {
		return remote.Target{}, nil, fmt.Errorf("reading the admin key of %s: %w", f.host, err)
	}
	signer, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return remote.Target{}, nil, fmt.Errorf("the admin key of %s in %s: %w", f.host, f.keyFile, err)
	}
	var keys remote.HostKeys = remote.TrustOnFirstUse{Store: hostkeys.Store{Client: c, Namespace: f.knownHostsNamespace}}
	if strings.TrimSpace(f.hostKey) != "" {
		if keys, err = remote.ParsePinned(f.hostKey); err != nil {
			return remote.Target{}, nil, err
		}
	}
	return remote.Target{Address: f.host, User: f.user, Signer: signer, HostKeys: keys, DialTimeout: f.dialTimeout}, keyPEM, nil
}

func newHostProvisionCommand() *cobra.Command {
	var (
		hf                                                                                    hostFlags
		userName, authorizedKey, owner, sudoCommands, dirFile, platform, uidRange, limitsText string
	)
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Create a task's throwaway build user on a host, with the task's public key as its only key",
		Long: `provision is the step of the provision TaskRun (--provisioner=taskrun). It logs in to HOST
as USER with the ssh workspace's key (verifying the host's key) and creates build user
USER_NAME, which must not exist yet, with AUTHORIZED_KEY as its only key, a build directory,
resource limits and exactly the sudo rights of SUDO_COMMANDS. It never sees the task's private
key and writes no Secret: the controller made the key and writes the task's secret itself.
The build directory goes to --user-dir-file (the TaskRun's user-dir result).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var sudo []string
			if strings.TrimSpace(sudoCommands) != "" {
				var err error
				if sudo, err = config.ParseSudoCommands(sudoCommands); err != nil {
					return fmt.Errorf("SUDO_COMMANDS: %w", err)
				}
			}
			uids, err := config.ParseUIDRange(uidRange)
			if err != nil {
				return fmt.Errorf("UID_RANGE: %w", err)
			}
			limits, err := config.ParseBuildLimitsText(limitsText)
			if err != nil {
				return fmt.Errorf("LIMITS: %w", err)
			}
			_, target, _, err := hf.login()
			if err != nil {
				return err
			}
			dir, err := hostops.CreateUserOn(cmd.Context(), target, platform, hostops.NewUser{
				Name: userName, AuthorizedKey: []byte(authorizedKey), Owner: owner, SudoCommands: sudo, UIDs: uids, Limits: limits})
			if err != nil {
				return err
			}
			if dirFile != "" {
				if err := os.WriteFile(dirFile, []byte(dir), 0o644); err != nil {
					return fmt.Errorf("writing the user-dir result: %w", err)
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "created build user %s on %s; build directory %s\n", userName, hf.host, dir)
			return nil
		},
	}
	hf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&userName, "user-name", "", "the build user to create (USER_NAME)")
	f.StringVar(&authorizedKey, "authorized-key", "", "the task's public key, an authorized_keys line (AUTHORIZED_KEY)")
	f.StringVar(&owner, "owner", "", "the user TaskRun, recorded beside the user (OWNER)")
	f.StringVar(&sudoCommands, "sudo-commands", "", "comma list of the commands the build user may run with sudo (SUDO_COMMANDS)")
	f.StringVar(&platform, "platform", "", "the platform the host serves (RAW_PLATFORM)")
	f.StringVar(&uidRange, "uid-range", "", "FIRST-LAST: the IDs Linux build users get (UID_RANGE, the config's build-uid-range; its default when empty)")
	f.StringVar(&limitsText, "limits", "", "the build's limits as key=value,... of the config's limit keys, like nproc-hard=2000 (LIMITS; berth's defaults when empty)")
	f.StringVar(&dirFile, "user-dir-file", "", "file to write the build directory to (the user-dir result)")
	_ = cmd.MarkFlagRequired("user-name")
	_ = cmd.MarkFlagRequired("authorized-key")
	return cmd
}

func newHostCleanCommand() *cobra.Command {
	var (
		hf                 hostFlags
		userName, platform string
	)
	cmd := &cobra.Command{
		Use:   "clean",
		Short: "Remove a build user, its processes and home from a host (gone already is success)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, target, _, err := hf.login()
			if err != nil {
				return err
			}
			if err := hostops.CleanOn(cmd.Context(), target, platform, userName); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s from %s\n", userName, hf.host)
			return nil
		},
	}
	hf.register(cmd)
	cmd.Flags().StringVar(&userName, "user-name", "", "the build user to remove (USER_NAME)")
	cmd.Flags().StringVar(&platform, "platform", "", "the platform the host serves (RAW_PLATFORM)")
	_ = cmd.MarkFlagRequired("user-name")
	return cmd
}

func newHostUpdateCommand() *cobra.Command {
	var (
		hf                                     hostFlags
		diskPath, minFree, maintenance, resDir string
		staleAfter                             time.Duration
	)
	cmd := &cobra.Command{
		Use:   "update",
		Short: "Check a static host's health, remove stale build users, run its maintenance command",
		Long: `update is the step of the periodic update TaskRun of a static host. It reports healthy or
not with a reason — unreachable, less than --min-free-disk free at --disk-path, a failing
--maintenance-command — and removes build users older than --stale-after whose TaskRun no
longer exists. With --results-dir the outcome goes to the files healthy and reason there
(the TaskRun's results), and the command succeeds even for an unhealthy host: the result is
the answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			minFreeBytes, err := resource.ParseQuantity(minFree)
			if err != nil {
				return fmt.Errorf("--min-free-disk %q: %w", minFree, err)
			}
			c, target, _, err := hf.login()
			if err != nil {
				return err
			}
			report := hostops.Update(ctx, hostops.UpdateRequest{
				Target: target, DiskPath: diskPath, MinFreeBytes: uint64(minFreeBytes.Value()), StaleAfter: staleAfter,
				MaintenanceCommand: maintenance,
				TaskRunExists: func(ctx context.Context, ns, name string) (bool, error) {
					err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pipelinev1.TaskRun{})
					if apierrors.IsNotFound(err) {
						return false, nil
					}
					return err == nil, err
				},
			})
			for _, u := range report.Removed {
				fmt.Fprintf(cmd.OutOrStdout(), "removed stale build user %s\n", u)
			}
			if report.Healthy {
				fmt.Fprintf(cmd.OutOrStdout(), "host %s is healthy\n", hf.host)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "host %s is unhealthy: %s\n", hf.host, report.Reason)
			}
			if report.Warning != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "warning: %s\n", report.Warning)
			}
			if resDir == "" {
				if !report.Healthy {
					return errors.New(report.Reason)
				}
				return nil
			}
			if err := os.WriteFile(filepath.Join(resDir, "healthy"), []byte(fmt.Sprint(report.Healthy)), 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(resDir, "reason"), []byte(report.Reason), 0o644); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(resDir, "warning"), []byte(report.Warning), 0o644)
		},
	}
	hf.register(cmd)
	cmd.Flags().StringVar(&diskPath, "disk-path", "/home", "where builds write; its free space is checked")
	cmd.Flags().StringVar(&minFree, "min-free-disk", "10Gi", "less free space than this makes the host unhealthy")
	cmd.Flags().DurationVar(&staleAfter, "stale-after", 24*time.Hour, "age after which a build user whose TaskRun is gone is removed")
	cmd.Flags().StringVar(&maintenance, "maintenance-command", "", "a command to run on the host as the admin user; failing makes it unhealthy")
	cmd.Flags().StringVar(&resDir, "results-dir", "", "directory to write the results healthy, reason and warning into (the TaskRun's results)")
	return cmd
}
