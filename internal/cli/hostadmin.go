package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
)

// The operator's verbs on a host. They only edit the host's BuildHost record: the controller
// carries them out, so they work the same whichever provisioner mode runs.

type hostAdminFlags struct{ namespace, kubeconfig string }

func (f *hostAdminFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", defaultNamespace(), "the controller's namespace")
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
}

func newHostDrainCommand() *cobra.Command {
	var f hostAdminFlags
	cmd := &cobra.Command{
		Use:   "drain HOST",
		Short: "Give the host no new task; tasks on it finish and are cleaned as usual",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return editBuildHost(cmd.Context(), f, args[0], cmd.OutOrStdout(), func(bh *berthv1.BuildHost) string {
				bh.Spec.Drained = true
				return "drained: it takes no new task"
			})
		},
	}
	f.register(cmd)
	return cmd
}

func newHostUndrainCommand() *cobra.Command {
	var f hostAdminFlags
	cmd := &cobra.Command{
		Use:   "undrain HOST",
		Short: "Let a drained host take tasks again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return editBuildHost(cmd.Context(), f, args[0], cmd.OutOrStdout(), func(bh *berthv1.BuildHost) string {
				bh.Spec.Drained = false
				if bh.Status.Quarantined {
					return "undrained; it stays quarantined until a health check passes: " + bh.Status.QuarantineReason
				}
				return "undrained: it takes tasks again"
			})
		},
	}
	f.register(cmd)
	return cmd
}

func newHostForgetCommand() *cobra.Command {
	var f hostAdminFlags
	var yes bool
	cmd := &cobra.Command{
		Use:   "forget HOST",
		Short: "Drop every build user still owed a cleanup on a host that is gone for good, and drain it",
		Long: `forget is for a host that will not come back. berth stops retrying the cleanups it owes
the host, frees their slots and leaves the host drained. If the host does come back, the build
users named in the warning are still on it: remove them by hand.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return fmt.Errorf("forget drops cleanups berth still owes host %s; say --yes to do it", args[0])
			}
			owed, err := owedUsers(cmd.Context(), f, args[0])
			if err != nil {
				return err
			}
			return editBuildHost(cmd.Context(), f, args[0], cmd.OutOrStdout(), func(bh *berthv1.BuildHost) string {
				bh.Spec.Forget = true
				if len(owed) > 0 {
					return fmt.Sprintf("to be forgotten: WARNING: %d build user(s) will never be removed from it by berth; if the host comes back, remove them by hand: %s",
						len(owed), strings.Join(owed, ", "))
				}
				return "to be forgotten: it owed no cleanup"
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm that the host's pending cleanups are to be dropped")
	return cmd
}

// owedUsers lists the build users whose cleanup berth still owes host, with their TaskRuns.
func owedUsers(ctx context.Context, f hostAdminFlags, host string) ([]string, error) {
	c, err := kubeClient(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	var list berthv1.AllocationList
	if err := c.List(ctx, &list, client.InNamespace(f.namespace)); err != nil {
		return nil, fmt.Errorf("listing Allocations in %s: %w", f.namespace, err)
	}
	var owed []string
	for _, rec := range list.Items {
		for _, d := range rec.Status.Debts {
			if d.Host == host || berthv1.BuildHostName(d.Host) == host {
				owed = append(owed, d.BuildUser+" (of "+rec.Spec.TaskRun.Key()+")")
			}
		}
	}
	return owed, nil
}

// editBuildHost patches the record of host (its name in the config, or the record's name), or
// creates it when berth has not recorded the host yet: berth fills in its status at the next
// check.
func editBuildHost(ctx context.Context, f hostAdminFlags, host string, out io.Writer, edit func(*berthv1.BuildHost) string) error {
	c, err := kubeClient(f.kubeconfig)
	if err != nil {
		return err
	}
	var list berthv1.BuildHostList
	if err := c.List(ctx, &list, client.InNamespace(f.namespace)); err != nil {
		return fmt.Errorf("listing BuildHosts in %s: %w", f.namespace, err)
	}
	for i := range list.Items {
		bh := &list.Items[i]
		if bh.Name != host && bh.Spec.HostName != host {
			continue
		}
		patch := client.MergeFrom(bh.DeepCopy())
		what := edit(bh)
		if err := c.Patch(ctx, bh, patch); err != nil {
			return fmt.Errorf("updating BuildHost %s/%s: %w", f.namespace, bh.Name, err)
		}
		fmt.Fprintf(out, "host %s %s\n", bh.Spec.HostName, what)
		return nil
	}
	bh := &berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: berthv1.BuildHostName(host),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth"}},
		Spec: berthv1.BuildHostSpec{HostName: host},
	}
	what := edit(bh)
	if err := c.Create(ctx, bh); err != nil {
		return fmt.Errorf("recording host %s in %s: %w", host, f.namespace, err)
	}
	fmt.Fprintf(out, "host %s %s (berth had not checked it yet; if no platform of the config lists %q, this does nothing)\n", host, what, host)
	return nil
}
