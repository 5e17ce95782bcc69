package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/kubescheme"
	"github.com/berth-ci/berth/internal/status"
)

type statusOptions struct {
	kubeconfig, context, namespace, output string
	watch                                  bool
	interval                               time.Duration
}

func newStatusCommand() *cobra.Command {
	o := statusOptions{namespace: defaultNamespace(), interval: 5 * time.Second}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "How berth's platforms stand: capacity and use, hosts and their health, waiting tasks with their place in line",
		Long: `status reads berth's records (Allocations and BuildHosts) and its config in --namespace,
and changes nothing. Per platform: strategy, capacity (slots of static hosts, or max-instances
of a dynamic platform), used (slots held, or VMs up), booting VMs, running and queued tasks,
the oldest wait. Per host or VM: slots used of total, health (ok, quarantined, drained,
retired) with its reason, age. Per waiting TaskRun: its place in line, computed by berth's own
ledger (namespaces take turns; first queued, first served inside one), how long it has waited,
and an ETA: position × the platform's hand-over interval, the mean interval between its
recent Ready transitions (or the time since the last one, if longer); unknown while the
records hold fewer than two. The controller shows its own count of the place on the waiting
TaskRun itself, in the annotation berth.dev/queue-position (rewritten at most every 10s).

-o json and -o yaml print:
  {namespace, time, platforms: [{platform, strategy, configured, capacity, capacityUnit
  ("slots", "instances" or "" for local), used, booting, running, queued, oldestWaitSeconds,
  handOverSeconds, hosts: [{name, kind ("static" or "vm"), state (a VM's phase), slotsUsed,
  slots, health, reason, ageSeconds}], waiting: [{namespace, name, position, waitedSeconds,
  etaSeconds}]}]}
Durations are whole seconds; null when unknown. state and reason are left out when empty.

--watch prints again whenever a record changes, and at least every --interval; on a terminal
it redraws the screen, elsewhere it prints one report after the other (a stream of JSON
documents with -o json, YAML documents with -o yaml).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch o.output {
			case "", "table", "json", "yaml":
			default:
				return fmt.Errorf("-o %s: want json, yaml or table", o.output)
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			if o.watch {
				return o.watchStatus(cmd.Context(), c, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			r, err := readStatus(cmd.Context(), c, o.namespace)
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config, or in-cluster)")
	f.StringVar(&o.context, "context", "", "the kubeconfig context to use (default: its current context)")
	f.StringVarP(&o.namespace, "namespace", "n", o.namespace, "berth's namespace, where its records and config are")
	f.StringVarP(&o.output, "output", "o", "", "json or yaml (default: tables)")
	f.BoolVarP(&o.watch, "watch", "w", false, "print again whenever berth's records change")
	f.DurationVar(&o.interval, "interval", o.interval, "with --watch, print at least this often (ages, waits and ETAs move on)")
	return cmd
}

func (o statusOptions) client() (client.WithWatch, error) {
	cfg, err := clusterConfig(o.kubeconfig, o.context).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster to talk to (--kubeconfig, $KUBECONFIG, ~/.kube/config or in-cluster): %w", err)
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: kubescheme.New()})
}

// readStatus reads berth's records and config in namespace and sums them up.
func readStatus(ctx context.Context, c client.Reader, namespace string) (status.Report, error) {
	var records berthv1.AllocationList
	if err := c.List(ctx, &records, client.InNamespace(namespace)); err != nil {
		return status.Report{}, fmt.Errorf("listing Allocations in %s: %w", namespace, err)
	}
	var hosts berthv1.BuildHostList
	if err := c.List(ctx, &hosts, client.InNamespace(namespace)); err != nil {
		return status.Report{}, fmt.Errorf("listing BuildHosts in %s: %w", namespace, err)
	}
	cfg, err := configInForce(ctx, c, namespace)
	if err != nil {
		return status.Report{}, err
	}
	// A task waits without a record until it gets a slot: berth's waiting label on its
	// TaskRun shows it (a tenant could set the label on its own TaskRun, which only adds it to
	// this view).
	var waiting pipelinev1.TaskRunList
	if err := c.List(ctx, &waiting, client.HasLabels{contract.WaitingForPlatformLabel}); err != nil {
		return status.Report{}, fmt.Errorf("listing waiting TaskRuns: %w", err)
	}
	r := status.Summarize(snapshot(time.Now(), cfg, hosts.Items, records.Items, waiting.Items))
	r.Namespace = namespace
	return r, nil
}

// configInForce is the config the controller serves, as hostconfig.Read finds it.
func configInForce(ctx context.Context, c client.Reader, namespace string) (*config.Config, error) {
	cfg, err := hostconfig.Read(ctx, c, namespace)
	if err == nil && cfg == nil {
		err = fmt.Errorf("berth has no usable config in namespace %s: want one ConfigMap labelled %s there; is this berth's namespace (-n)?",
			namespace, hostconfig.ConfigLabel)
	}
	return cfg, err
}

// snapshot turns the config and records into what package status sums up.
func snapshot(now time.Time, cfg *config.Config, hosts []berthv1.BuildHost, records []berthv1.Allocation, waiting []pipelinev1.TaskRun) status.Snapshot {
	s := status.Snapshot{Now: now}
	for _, p := range slices.Sorted(maps.Keys(cfg.Platforms)) {
		sp := status.Platform{Name: string(p), Strategy: string(cfg.Platforms[p])}
		if d := cfg.Dynamic[p]; d != nil {
			sp.MaxInstances = d.MaxInstances
		}
		s.Platforms = append(s.Platforms, sp)
	}
	static := map[string]*status.Host{}
	for _, h := range cfg.Hosts {
		static[h.Name] = &status.Host{Name: h.Name, Platform: string(h.Platform), Slots: h.Concurrency, Configured: true}
	}
	for i := range hosts {
		bh := &hosts[i]
		if in := bh.Spec.Instance; in != nil {
			phase := berthv1.InstanceLaunching
			if bh.Status.Instance != nil && bh.Status.Instance.Phase != "" {
				phase = bh.Status.Instance.Phase
			}
			s.Hosts = append(s.Hosts, status.Host{Name: bh.Name, Platform: in.Platform, Slots: in.Slots,
				VM: &status.VM{State: string(phase), Booting: phase == berthv1.InstanceLaunching || phase == berthv1.InstanceBooting,
					Pooled: in.Pooled, Retired: in.Retire},
				Drained: bh.Spec.Drained, Quarantined: bh.Status.Quarantined, Reason: bh.Status.QuarantineReason, Since: bh.CreationTimestamp.Time})
			continue
		}
		h := static[bh.Host()]
		if h == nil {
			h = &status.Host{Name: bh.Host(), Platform: bh.Status.Platform}
			static[h.Name] = h
		}
		h.Drained, h.Quarantined, h.Reason, h.Since = bh.Spec.Drained, bh.Status.Quarantined, bh.Status.QuarantineReason, bh.CreationTimestamp.Time
	}
	for _, name := range slices.Sorted(maps.Keys(static)) {
		s.Hosts = append(s.Hosts, *static[name])
	}
	for i := range records {
		rec := &records[i]
		t := status.Task{Namespace: rec.Spec.TaskRun.Namespace, Name: rec.Spec.TaskRun.Name, Platform: rec.Spec.Platform,
			Strategy: rec.Spec.Strategy, Waiting: rec.Status.Phase == berthv1.PhaseWaiting, Queued: rec.Spec.Queued.Time,
			ReservedAt: timeOf(rec.Status.ReservedAt), ReadyAt: timeOf(rec.Status.ReadyAt)}
		if held := rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady; held && rec.Status.Login != nil {
			t.Host = rec.Status.Login.Host
		}
		for _, d := range rec.Status.Debts {
			if d.HoldsSlot {
				t.SlotDebts = append(t.SlotDebts, d.Host)
			}
		}
		s.Tasks = append(s.Tasks, t)
	}
	recorded := make(map[types.UID]bool, len(records))
	for i := range records {
		recorded[records[i].Spec.TaskRun.UID] = true
	}
	for i := range waiting {
		tr := &waiting[i]
		platform := contract.Platform(tr)
		if recorded[tr.UID] || tr.IsDone() || platform == "" {
			continue
		}
		strategy, _ := cfg.Strategy(config.Platform(platform))
		s.Tasks = append(s.Tasks, status.Task{Namespace: tr.Namespace, Name: tr.Name, Platform: platform,
			Strategy: string(strategy), Waiting: true, Queued: tr.CreationTimestamp.Time})
	}
	return s
}

func timeOf(t *berthv1.MicroTime) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

func (o statusOptions) print(w io.Writer, r status.Report) error {
	switch o.output {
	case "json":
		data, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", data)
		return err
	case "yaml":
		data, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		if o.watch {
			fmt.Fprintln(w, "---")
		}
		_, err = w.Write(data)
		return err
	}
	printStatusTables(w, r)
	return nil
}

// printStatusTables prints the platforms, then their hosts, then the waiting tasks.
func printStatusTables(w io.Writer, r status.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLATFORM\tSTRATEGY\tCAPACITY\tUSED\tBOOTING\tRUNNING\tQUEUED\tOLDEST WAIT\tHAND-OVER")
	for _, p := range r.Platforms {
		if p.Strategy == status.StrategyLocal {
			fmt.Fprintf(tw, "%s\t%s\tcluster\t-\t-\t-\t-\t-\t-\n", p.Platform, p.Strategy)
			continue
		}
		strategy := p.Strategy
		if !p.Configured {
			strategy += " (removed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d %s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Platform, strategy, p.Capacity, p.CapacityUnit,
			p.Used, p.Booting, p.Running, p.Queued, seconds(p.OldestWaitSeconds, "-"), seconds(p.HandOverSeconds, "unknown"))
	}
	tw.Flush()
	var hosts, waiting bool
	for _, p := range r.Platforms {
		hosts = hosts || len(p.Hosts) > 0
		waiting = waiting || len(p.Waiting) > 0
	}
	if hosts {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOST\tPLATFORM\tKIND\tSTATE\tSLOTS\tHEALTH\tAGE\tREASON")
		for _, p := range r.Platforms {
			for _, h := range p.Hosts {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", h.Name, p.Platform, h.Kind, orDash(h.State),
					h.SlotsUsed, h.Slots, h.Health, seconds(h.AgeSeconds, "-"), orDash(h.Reason))
			}
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	if !waiting {
		fmt.Fprintln(w, "No TaskRun waits for a host.")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WAITING TASKRUN\tPLATFORM\tPOSITION\tWAITED\tETA")
	for _, p := range r.Platforms {
		for _, t := range p.Waiting {
			fmt.Fprintf(tw, "%s/%s\t%s\t%d\t%s\t%s\n", t.Namespace, t.Name, p.Platform, t.Position,
				seconds(&t.WaitedSeconds, "-"), seconds(t.ETASeconds, "unknown"))
		}
	}
	tw.Flush()
}

// seconds prints a duration as kubectl prints ages; unknown when it is null.
func seconds(s *int64, unknown string) string {
	if s == nil {
		return unknown
	}
	return duration.HumanDuration(time.Duration(*s) * time.Second)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// watchStatus prints the status whenever berth's records or config change, and at least every
// interval, until ctx ends. A failed read is reported and retried at the next change or tick.
func (o statusOptions) watchStatus(ctx context.Context, c client.WithWatch, out, errOut io.Writer) error {
	changed := make(chan struct{}, 1)
	for _, list := range []client.ObjectList{&berthv1.AllocationList{}, &berthv1.BuildHostList{}, &corev1.ConfigMapList{}} {
		go watchChanges(ctx, c, list, o.namespace, o.interval, changed)
	}
	terminal := isTerminal(out)
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	for {
		r, err := readStatus(ctx, c, o.namespace)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fmt.Fprintf(errOut, "%s: %v\n", time.Now().Format(time.TimeOnly), err)
		default:
			if terminal {
				fmt.Fprint(out, "\x1b[H\x1b[2J") // redraw in place
			}
			if o.output == "" || o.output == "table" {
				fmt.Fprintf(out, "berth status -n %s, %s (every %s and on change)\n\n", o.namespace, r.Time.Format(time.TimeOnly), o.interval)
			}
			if err := o.print(out, r); err != nil {
				return err
			}
			if !terminal && (o.output == "" || o.output == "table") {
				fmt.Fprintln(out)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-changed:
			// A change rarely comes alone (a hand-over writes two records): take them together.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(250 * time.Millisecond):
			}
			select {
			case <-changed:
			default:
			}
		}
	}
}

// watchChanges signals changed on every change of list's objects in namespace, from a watch
// that starts where a fresh list ends (so existing objects are no change) and starts over when
// it ends.
func watchChanges(ctx context.Context, c client.WithWatch, list client.ObjectList, namespace string, retry time.Duration, changed chan<- struct{}) {
	for ctx.Err() == nil {
		if err := c.List(ctx, list, client.InNamespace(namespace)); err == nil {
			rv := list.(metav1.ListInterface).GetResourceVersion()
			w, err := c.Watch(ctx, list, &client.ListOptions{Namespace: namespace, Raw: &metav1.ListOptions{ResourceVersion: rv}})
			if err == nil {
				started := time.Now()
				for range w.ResultChan() {
					select {
					case changed <- struct{}{}:
					default:
					}
				}
				w.Stop()
				if time.Since(started) > retry {
					continue // the apiserver ends watches now and then: start over at once
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// isTerminal tells whether w is a terminal, where --watch redraws the screen.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
