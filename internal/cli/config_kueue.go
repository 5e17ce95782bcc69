package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/config/kueue"
)

// defaultClusterQueue is the ClusterQueue tekton-kueue admits into on every Konflux cluster
// (metadata.name of each deploy/kueue-*-cluster-queue.yaml in ../shared/real).
const defaultClusterQueue = "cluster-pipeline-queue"

// kueueSource says where validate reads the ClusterQueue from, if at all.
type kueueSource struct {
	file, name, kubeconfig string
	live                   bool
}

func (s kueueSource) wanted() bool { return s.file != "" || s.live }

// read is the ClusterQueue and how to name it in the report.
func (s kueueSource) read(ctx context.Context) (kueue.ClusterQueue, string, error) {
	if s.file != "" {
		f, err := os.Open(s.file)
		if err != nil {
			return kueue.ClusterQueue{}, "", err
		}
		defer f.Close()
		queues, err := kueue.ReadClusterQueues(f, s.file)
		if err != nil {
			return kueue.ClusterQueue{}, "", err
		}
		q, err := kueue.Pick(queues, s.name, s.file)
		return q, s.file, err
	}
	name := s.name
	if name == "" {
		name = defaultClusterQueue
	}
	c, err := kubeClient(s.kubeconfig)
	if err != nil {
		return kueue.ClusterQueue{}, "", err
	}
	q, err := liveClusterQueue(ctx, c, name)
	return q, "clusterqueue " + name, err
}

// liveClusterQueue reads the ClusterQueue as unstructured, in the newest API version the
// cluster serves, so that berth needs neither Kueue's types nor a given Kueue release.
func liveClusterQueue(ctx context.Context, c client.Reader, name string) (kueue.ClusterQueue, error) {
	var lastErr error
	for _, version := range []string{"v1beta2", "v1beta1"} {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: version, Kind: "ClusterQueue"})
		err := c.Get(ctx, client.ObjectKey{Name: name}, obj)
		if meta.IsNoMatchError(err) {
			lastErr = err
			continue
		}
		if err != nil {
			return kueue.ClusterQueue{}, fmt.Errorf("reading ClusterQueue %s (kueue.x-k8s.io/%s): %w", name, version, err)
		}
		raw, err := obj.MarshalJSON()
		if err != nil {
			return kueue.ClusterQueue{}, fmt.Errorf("ClusterQueue %s: %w", name, err)
		}
		return kueue.ParseClusterQueue(raw)
	}
	return kueue.ClusterQueue{}, fmt.Errorf("the cluster serves no kueue.x-k8s.io ClusterQueue (is Kueue installed?): %w", lastErr)
}

type kueueDoc struct {
	ClusterQueue  string        `json:"clusterQueue"`
	Source        string        `json:"source"`
	Resources     []kueueRowDoc `json:"resources"`
	NotCompared   []string      `json:"notCompared"`
	Warnings      []string      `json:"warnings"`
	Disagreements int           `json:"disagreements"`
}

type kueueRowDoc struct {
	Resource  string   `json:"resource"`
	Platforms []string `json:"platforms"`
	// Quota is null when the ClusterQueue has none.
	Quota     *string `json:"quota"`
	Capacity  int     `json:"capacity"`
	Unbounded bool    `json:"unbounded"`
	Verdict   string  `json:"verdict"`
	Cost      string  `json:"cost"`
}

func kueueDocOf(rep kueue.Report, source string) *kueueDoc {
	d := &kueueDoc{ClusterQueue: rep.Queue, Source: source, Resources: []kueueRowDoc{}, NotCompared: append([]string{}, rep.Other...),
		Warnings: append([]string{}, rep.Warnings...), Disagreements: rep.Disagreements()}
	for _, r := range rep.Rows {
		row := kueueRowDoc{Resource: r.Resource, Platforms: []string{}, Capacity: r.Capacity, Unbounded: r.Unbounded, Verdict: string(r.Verdict), Cost: r.Cost}
		for _, p := range r.Platforms {
			row.Platforms = append(row.Platforms, string(p))
		}
		if r.Quota != nil {
			q := r.Quota.String()
			row.Quota = &q
		}
		d.Resources = append(d.Resources, row)
	}
	return d
}

func (d *kueueDoc) print(w io.Writer) {
	fmt.Fprintf(w, "\nKueue ClusterQueue %s (%s) against the config:\n", d.ClusterQueue, d.Source)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tPLATFORM\tQUOTA\tCAPACITY\tVERDICT")
	for _, r := range d.Resources {
		quota, capacity, platforms := "-", strconv.Itoa(r.Capacity), strings.Join(r.Platforms, ",")
		if r.Quota != nil {
			quota = *r.Quota
		}
		if r.Unbounded {
			capacity = "cluster"
		}
		switch {
		case len(r.Platforms) == 0:
			platforms, capacity = "-", "-"
		case r.Resource == kueue.AWSIP:
			platforms = fmt.Sprintf("%d charged", len(r.Platforms))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Resource, platforms, quota, capacity, r.Verdict)
	}
	tw.Flush()
	if len(d.NotCompared) > 0 {
		fmt.Fprintf(w, "not compared (no platform): %s\n", strings.Join(d.NotCompared, ", "))
	}
	for _, r := range d.Resources {
		if kueue.Verdict(r.Verdict).Disagrees() {
			fmt.Fprintf(w, "warning: kueue %s: %s\n", r.Resource, r.Cost)
		}
	}
	for _, msg := range d.Warnings {
		fmt.Fprintf(w, "warning: kueue: %s\n", msg)
	}
	if d.Disagreements == 0 {
		fmt.Fprintf(w, "%s: its quotas agree with the config\n", d.Source)
	} else {
		fmt.Fprintf(w, "%s: %d disagreement(s) with the config\n", d.Source, d.Disagreements)
	}
}

func newConfigKueueQuotasCommand() *cobra.Command {
	var file, namespace, kubeconfig, flavorPrefix, localQuota string
	cmd := &cobra.Command{
		Use:   "kueue-quotas",
		Short: "Print the Kueue quotas the host-config implies, as a ClusterQueue's resourceGroups",
		Long: `kueue-quotas prints, for the operator's GitOps repository, the per-platform quotas of a Kueue
ClusterQueue that match the host-config: for each platform the resource tekton-kueue asks for
(linux/arm64 → linux-arm64, linux/x86_64 → linux-x86-64) with a nominalQuota of the tasks the
config runs at once on it (static slots; max-instances, times concurrency for a pool). They are
printed as spec.resourceGroups entries, at most 16 resources per group, one flavor per group
named --flavor-prefix1, --flavor-prefix2, ... (create those ResourceFlavors, or rename them to
yours). Local platforms get --local-quota: berth bounds them by no count, and Kueue admits
nothing for a resource it has no quota for. The aws-ip quota (the tasks of every platform
tekton-kueue charges one) is printed as a comment, to set in the group that covers aws-ip.

berth writes nothing of Kueue's on the cluster. With -f it reads the ConfigMap from a file,
without it the live one, like validate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			local, err := resource.ParseQuantity(localQuota)
			if err != nil {
				return fmt.Errorf("--local-quota %q: %w", localQuota, err)
			}
			cm, source, err := readConfigMap(cmd.Context(), file, namespace, kubeconfig)
			if err != nil {
				return err
			}
			cfg, _ := config.Parse(cm.Data)
			if len(cfg.Fatal()) != 0 {
				return fmt.Errorf("%w: %s: %s", errInvalidConfig, source, cfg.Fatal().Summary())
			}
			return kueue.WriteResourceGroups(cmd.OutOrStdout(), kueue.Implied(kueue.Capacities(cfg), local), source, flavorPrefix)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "a YAML file holding the ConfigMap (default: the live one)")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", defaultNamespace(), "the controller's namespace, for the live ConfigMap")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	// platform-group-N is what Konflux's production and staging ClusterQueues call theirs.
	cmd.Flags().StringVar(&flavorPrefix, "flavor-prefix", "platform-group-", "the printed groups' flavors are this name with 1, 2, ... appended")
	// 1k is what Konflux's production and staging ClusterQueues give local, localhost and
	// linux-x86-64.
	cmd.Flags().StringVar(&localQuota, "local-quota", "1k", "the quota printed for local platforms, which berth bounds by no count")
	return cmd
}
