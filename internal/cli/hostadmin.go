package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
)

// The operator's verbs on a host. They only edit the host's BuildHost record: the controller
// carries them out, so they work the same whichever provisioner mode runs.

// hostEdit changes a BuildHost record and says what it did.
type hostEdit func(ctx context.Context, c client.Client, bh *berthv1.BuildHost) (string, error)

// newHostEditCommand is `berth host <use> HOST`; confirm, if set, names a flag that must be
// given before anything is changed.
func newHostEditCommand(use, short, long, confirm string, edit hostEdit) *cobra.Command {
	var namespace, kubeconfig string
	var confirmed bool
	cmd := &cobra.Command{
		Use:   use + " HOST",
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if confirm != "" && !confirmed {
				return fmt.Errorf("%s %s: say --%s to do it", use, args[0], confirm)
			}
			c, err := kubeClient(kubeconfig)
			if err != nil {
				return err
			}
			bh, created, err := buildHostRecord(cmd.Context(), c, namespace, args[0])
			if err != nil {
				return err
			}
			patch := client.MergeFrom(bh.DeepCopy())
			what, err := edit(cmd.Context(), c, bh)
			if err != nil {
				return err
			}
			if created {
				err = c.Create(cmd.Context(), bh)
				what += fmt.Sprintf(" (berth had not checked it yet; if no platform of the config lists %q, this does nothing)", bh.Host())
			} else {
				err = c.Patch(cmd.Context(), bh, patch)
			}
			if err != nil {
				return fmt.Errorf("writing BuildHost %s/%s: %w", namespace, bh.Name, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "host %s %s\n", bh.Host(), what)
			return nil
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", defaultNamespace(), "the controller's namespace")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
	if confirm != "" {
		cmd.Flags().BoolVar(&confirmed, confirm, false, "confirm that the host's pending cleanups are to be dropped")
	}
	return cmd
}

func newHostDrainCommand() *cobra.Command {
	return newHostEditCommand("drain", "Give the host no new task; tasks on it finish and are cleaned as usual", "", "",
		func(_ context.Context, _ client.Client, bh *berthv1.BuildHost) (string, error) {
			bh.Spec.Drained = true
			return "drained: it takes no new task", nil
		})
}

func newHostUndrainCommand() *cobra.Command {
	return newHostEditCommand("undrain", "Let a drained host take tasks again", "", "",
		func(_ context.Context, _ client.Client, bh *berthv1.BuildHost) (string, error) {
			bh.Spec.Drained = false
			if bh.Status.Quarantined {
				return "undrained; it stays quarantined until a health check passes: " + bh.Status.QuarantineReason, nil
			}
			return "undrained: it takes tasks again", nil
		})
}

func newHostForgetCommand() *cobra.Command {
	return newHostEditCommand("forget",
		"Drop every build user still owed a cleanup on a host that is gone for good, and drain it",
		`forget is for a host that will not come back. berth stops retrying the cleanups it owes
the host, frees their slots and leaves the host drained. If the host does come back, the build
users named in the warning are still on it: remove them by hand.`, "yes",
		func(ctx context.Context, c client.Client, bh *berthv1.BuildHost) (string, error) {
			var records berthv1.AllocationList
			if err := c.List(ctx, &records, client.InNamespace(bh.Namespace)); err != nil {
				return "", fmt.Errorf("listing Allocations in %s: %w", bh.Namespace, err)
			}
			var owed []string
			for _, rec := range records.Items {
				for _, d := range rec.Status.Debts {
					if d.Host == bh.Host() {
						owed = append(owed, d.BuildUser+" (of "+rec.Spec.TaskRun.Key()+")")
					}
				}
			}
			bh.Spec.Forget = true
			if len(owed) == 0 {
				return "to be forgotten: it owed no cleanup", nil
			}
			return fmt.Sprintf("to be forgotten: WARNING: %d build user(s) will never be removed from it by berth; if the host comes back, remove them by hand: %s",
				len(owed), strings.Join(owed, ", ")), nil
		})
}

// buildHostRecord finds the record of host (its name in the config, or the record's name), or
// makes a new one (created) when berth has not recorded the host yet: berth fills in its
// status at the next check.
func buildHostRecord(ctx context.Context, c client.Client, namespace, host string) (bh *berthv1.BuildHost, created bool, err error) {
	var list berthv1.BuildHostList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, false, fmt.Errorf("listing BuildHosts in %s: %w", namespace, err)
	}
	for i := range list.Items {
		if bh := &list.Items[i]; bh.Name == host || bh.Host() == host {
			return bh, false, nil
		}
	}
	return &berthv1.BuildHost{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: berthv1.BuildHostName(host),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "berth"}},
		Spec: berthv1.BuildHostSpec{HostName: host},
	}, true, nil
}
