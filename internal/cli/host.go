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
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/hostkeys"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/remote"
	"github.com/berth-ci/berth/internal/tasksecret"
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
		hf                                                              hostFlags
		secretName, taskRun, namespace, sudoCommands, platform, instTag string
	)
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Create a task's throwaway user and key on a host, and the secret the task waits for",
		Long: `provision is the step of the provision TaskRun. It logs in to HOST as USER with the ssh
workspace's key (verifying the host's key), creates the build user u-<hash of NAMESPACE and
TASKRUN_NAME> with a key generated here, its build directory, resource limits and exactly the
sudo rights of SUDO_COMMANDS, then creates SECRET_NAME in NAMESPACE, owned by the TaskRun, with
id_rsa, host (user@address) and user-dir.

On windows/... and darwin/... platforms no user is created: USER must be an unprivileged,
pre-made build user, and the task gets that user, its key and a directory of its own
(berth-builds/u-<hash>, relative to the user's home).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := hostops.ValidateTaskRunRef(namespace, taskRun); err != nil {
				return err
			}
			c, target, adminKey, err := hf.login()
			if err != nil {
				return err
			}
			var tr pipelinev1.TaskRun
			if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: taskRun}, &tr); err != nil {
				if apierrors.IsNotFound(err) {
					return fmt.Errorf("TaskRun %s/%s is gone; nothing to provision", namespace, taskRun)
				}
				return err
			}
			p, err := hostops.Provision(ctx, hostops.ProvisionRequest{
				Target: target, AdminKeyPEM: adminKey, Namespace: namespace, TaskRun: taskRun,
				SudoCommands: sudoCommands, Platform: platform,
			})
			if remote.IsHostKeyChanged(err) {
				postEvent(ctx, c, &tr, corev1.EventTypeWarning, "HostKeyChanged", err.Error())
			}
			if err != nil {
				return err
			}
			owner := tasksecret.Owner{Name: tr.Name, Namespace: tr.Namespace, UID: tr.UID}
			if err := tasksecret.Apply(ctx, c, tasksecret.ForHost(owner, secretName, p.Host(), p.UserDir, p.PrivateKeyPEM)); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "provisioned %s for TaskRun %s/%s; secret %s created\n", p.Host(), namespace, taskRun, secretName)
			return nil
		},
	}
	hf.register(cmd)
	cmd.Flags().StringVar(&secretName, "secret-name", "", "the secret to create (SECRET_NAME)")
	cmd.Flags().StringVar(&taskRun, "taskrun-name", "", "the user TaskRun (TASKRUN_NAME)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "the user TaskRun's namespace (NAMESPACE)")
	cmd.Flags().StringVar(&sudoCommands, "sudo-commands", "", "comma list of the commands the build user may run with sudo (SUDO_COMMANDS)")
	cmd.Flags().StringVar(&platform, "platform", "", "the platform asked for (RAW_PLATFORM)")
	cmd.Flags().StringVar(&instTag, "instance-tag", "", "the instance tag (INSTANCE_TAG); recorded, not used on static hosts")
	for _, f := range []string{"secret-name", "taskrun-name", "namespace"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

func newHostCleanCommand() *cobra.Command {
	var (
		hf                           hostFlags
		taskRun, namespace, platform string
	)
	cmd := &cobra.Command{
		Use:   "clean",
		Short: "Remove a task's build user, its processes and home from a host (done already is success)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := hostops.ValidateTaskRunRef(namespace, taskRun); err != nil {
				return err
			}
			user := hostops.LegacyUserName(namespace, taskRun)
			if strings.HasPrefix(platform, "windows/") || strings.HasPrefix(platform, "darwin/") {
				fmt.Fprintf(cmd.OutOrStdout(), "%s uses a pre-made build user; nothing to remove\n", platform)
				return nil
			}
			_, target, _, err := hf.login()
			if err != nil {
				return err
			}
			if err := hostops.Clean(cmd.Context(), target, user); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s from %s\n", user, hf.host)
			return nil
		},
	}
	hf.register(cmd)
	cmd.Flags().StringVar(&taskRun, "taskrun-name", "", "the user TaskRun whose user to remove (TASKRUN_NAME)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "the user TaskRun's namespace (NAMESPACE)")
	cmd.Flags().StringVar(&platform, "platform", "", "the platform (RAW_PLATFORM)")
	_ = cmd.MarkFlagRequired("taskrun-name")
	_ = cmd.MarkFlagRequired("namespace")
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
			if resDir == "" {
				if !report.Healthy {
					return errors.New(report.Reason)
				}
				return nil
			}
			if err := os.WriteFile(filepath.Join(resDir, "healthy"), []byte(fmt.Sprint(report.Healthy)), 0o644); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(resDir, "reason"), []byte(report.Reason), 0o644)
		},
	}
	hf.register(cmd)
	cmd.Flags().StringVar(&diskPath, "disk-path", "/home", "where builds write; its free space is checked")
	cmd.Flags().StringVar(&minFree, "min-free-disk", "10Gi", "less free space than this makes the host unhealthy")
	cmd.Flags().DurationVar(&staleAfter, "stale-after", 24*time.Hour, "age after which a build user whose TaskRun is gone is removed")
	cmd.Flags().StringVar(&maintenance, "maintenance-command", "", "a command to run on the host as the admin user; failing makes it unhealthy")
	cmd.Flags().StringVar(&resDir, "results-dir", "", "directory to write the results healthy and reason into (the TaskRun's results)")
	return cmd
}

// postEvent records an Event on the user's TaskRun, where the person waiting for it looks.
// It is best effort: the step's own error says the same.
func postEvent(ctx context.Context, c client.Client, tr *pipelinev1.TaskRun, eventType, reason, note string) {
	if len(note) > 1000 {
		note = note[:997] + "..."
	}
	host, _ := os.Hostname()
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", tr.Name, time.Now().UnixNano()), Namespace: tr.Namespace},
		EventTime:           metav1.NewMicroTime(time.Now()),
		ReportingController: "berth.dev/host-step",
		ReportingInstance:   "berth-host-step-" + host,
		Action:              "Provision",
		Reason:              reason,
		Type:                eventType,
		Note:                note,
		Regarding: corev1.ObjectReference{APIVersion: "tekton.dev/v1", Kind: "TaskRun",
			Name: tr.Name, Namespace: tr.Namespace, UID: tr.UID, ResourceVersion: tr.ResourceVersion},
	}
	if err := c.Create(ctx, ev); err != nil {
		fmt.Fprintf(os.Stderr, "recording event %s on TaskRun %s/%s: %v\n", reason, tr.Namespace, tr.Name, err)
	}
}
