package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/config/kueue"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/kubescheme"
)

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the host-config ConfigMap",
	}
	cmd.AddCommand(newConfigValidateCommand(), newConfigKueueQuotasCommand())
	return cmd
}

func newConfigValidateCommand() *cobra.Command {
	var (
		file, namespace, kubeconfig string
		asJSON, strict              bool
		queue                       kueueSource
	)
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a host-config ConfigMap: which platforms berth can serve, and every problem with its key",
		Long: `validate judges the host-config ConfigMap the way the controller does, platform by platform:
a mistake makes only the platform (or static host) it touches unusable, and berth serves the
rest. It prints a table of the platforms (strategy, capacity, usable, first problem), then
every problem with the key it is about.

With -f it reads a ConfigMap from a YAML file; without, it reads the live ConfigMap labelled
` + hostconfig.ConfigLabel + ` in --namespace through your kubeconfig, and also checks that
the secrets the config names exist and hold the keys berth needs.

--json prints {"platforms": [{"platform", "strategy", "capacity", "usable", "problems":
[{"key", "severity", "message"}]}], "problems": [...]} with the problems of the file as a
whole at the top.

With --kueue FILE (a ClusterQueue, alone or among other documents) or --kueue-live (the
ClusterQueue --cluster-queue, default ` + defaultClusterQueue + `, read through your kubeconfig)
it also holds the queue's nominal quotas against the capacity the config gives each platform,
resource by resource as tekton-kueue asks for them (linux/arm64 → linux-arm64), and aws-ip
against the tasks of every platform tekton-kueue charges one. Each disagreement is a warning
that says what it costs; --json adds them under "kueue". berth config kueue-quotas prints the
quotas that would agree.

It exits 0 when every listed platform is usable, and 1 when one is not, when a global setting
cannot be used, or when the file is unusable as a whole. --strict also exits 1 on any error,
such as a static host left out of a pool that other hosts still serve, and on any
disagreement with the ClusterQueue.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			queue.kubeconfig = kubeconfig
			var (
				extra config.Problems
				ctx   = cmd.Context()
			)
			if queue.file != "" && queue.live {
				return errors.New("--kueue and --kueue-live both name a ClusterQueue: give one")
			}
			cm, source, liveRead, err := readConfigMapFrom(ctx, file, namespace, kubeconfig)
			if err != nil {
				return err
			}
			if _, ok := cm.Labels[hostconfig.ConfigLabel]; !ok {
				extra = append(extra, config.Problem{Severity: config.Warning, Key: "metadata.labels",
					Message: "no " + hostconfig.ConfigLabel + " label: the controller finds its config by this label and would not see this ConfigMap"})
			}
			cfg, _ := config.Parse(cm.Data)
			if liveRead != nil && len(cfg.Fatal()) == 0 {
				extra = append(extra, hostconfig.MissingSecrets(ctx, liveRead, namespace, cfg)...)
			}
			v := judge(cfg, extra)
			if queue.wanted() {
				q, qSource, err := queue.read(ctx)
				if err != nil {
					return err
				}
				v.doc.Kueue = kueueDocOf(kueue.Compare(q, kueue.Capacities(cfg)), qSource)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(v.doc); err != nil {
					return err
				}
			} else {
				v.print(cmd.OutOrStdout(), source)
				if v.doc.Kueue != nil {
					v.doc.Kueue.print(cmd.OutOrStdout())
				}
			}
			return v.exit(source, strict)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "a YAML file holding the ConfigMap (default: the live one)")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", defaultNamespace(), "the controller's namespace, for the live ConfigMap")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the verdict as JSON")
	cmd.Flags().BoolVar(&strict, "strict", false, "exit 1 on any error, also one that leaves a usable platform's host out, and on any disagreement with the Kueue ClusterQueue")
	cmd.Flags().StringVar(&queue.file, "kueue", "", "also hold the config against the Kueue ClusterQueue in this YAML file (one or more documents)")
	cmd.Flags().BoolVar(&queue.live, "kueue-live", false, "also hold the config against the live Kueue ClusterQueue (--cluster-queue), via kubeconfig")
	cmd.Flags().StringVar(&queue.name, "cluster-queue", "", "the ClusterQueue to compare: needed when --kueue's file holds several; for --kueue-live default "+defaultClusterQueue)
	return cmd
}

var errInvalidConfig = errors.New("invalid config")

// verdict is what validate says of a config: the document --json prints, and the counts the
// table's summary and the exit code come from.
type verdict struct {
	doc       validateDoc
	all       config.Problems
	unusable  int
	fileError bool // the file as a whole, or a global key, is unusable
}

type validateDoc struct {
	Platforms []platformDoc `json:"platforms"`
	Problems  []problemDoc  `json:"problems"`
	// Kueue is set with --kueue or --kueue-live.
	Kueue *kueueDoc `json:"kueue,omitempty"`
}

type platformDoc struct {
	Platform string       `json:"platform"`
	Strategy string       `json:"strategy"`
	Capacity int          `json:"capacity"`
	Usable   bool         `json:"usable"`
	Problems []problemDoc `json:"problems"`
}

type problemDoc struct {
	Key      string `json:"key"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

func problemDocs(ps config.Problems) []problemDoc {
	out := make([]problemDoc, 0, len(ps))
	for _, p := range ps {
		out = append(out, problemDoc{Key: p.Key, Severity: string(p.Severity), Message: p.Message})
	}
	return out
}

// judge takes cfg's verdict per platform and adds the problems found outside its data (the
// secrets it names, the ConfigMap's label) where they belong.
func judge(cfg *config.Config, extra config.Problems) verdict {
	v := verdict{all: append(append(config.Problems{}, cfg.Problems()...), extra...), doc: validateDoc{Platforms: []platformDoc{}}}
	file := cfg.FileProblems()
	extraOf := map[config.Platform]config.Problems{}
	for _, p := range extra {
		if p.Platform == "" {
			file = append(file, p)
		} else {
			extraOf[p.Platform] = append(extraOf[p.Platform], p)
		}
	}
	for _, r := range cfg.Report() {
		if !r.Usable {
			v.unusable++
		}
		v.doc.Platforms = append(v.doc.Platforms, platformDoc{Platform: string(r.Platform), Strategy: string(r.Strategy),
			Capacity: r.Capacity, Usable: r.Usable, Problems: problemDocs(append(r.Problems, extraOf[r.Platform]...))})
	}
	v.doc.Problems = problemDocs(file)
	for _, p := range file.Errors() {
		// a host whose platform cannot be told is left out like any other host
		v.fileError = v.fileError || !strings.HasPrefix(p.Key, "host.")
	}
	return v
}

func (v verdict) print(w io.Writer, source string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLATFORM\tSTRATEGY\tCAPACITY\tUSABLE\tFIRST PROBLEM")
	for _, p := range v.doc.Platforms {
		capacity, usable, first := strconv.Itoa(p.Capacity), "yes", "-"
		if p.Strategy == string(config.StrategyLocal) {
			capacity = "cluster"
		}
		if !p.Usable {
			usable = "NO"
		}
		if len(p.Problems) > 0 {
			first = p.Problems[0].Severity + ": " + p.Problems[0].Key + ": " + p.Problems[0].Message
			if len(first) > 100 {
				first = first[:97] + "..."
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Platform, p.Strategy, capacity, usable, first)
	}
	tw.Flush()
	if len(v.all) > 0 {
		fmt.Fprintln(w)
	}
	errs := 0
	for _, p := range v.all {
		fmt.Fprintln(w, p.String())
		if p.Severity == config.Error {
			errs++
		}
	}
	usable := len(v.doc.Platforms) - v.unusable
	switch {
	case v.unusable > 0 || v.fileError:
		fmt.Fprintf(w, "%s: %d of %d platform(s) usable; %d error(s), %d warning(s)\n", source, usable, len(v.doc.Platforms), errs, len(v.all)-errs)
	case len(v.all) > 0:
		fmt.Fprintf(w, "%s: valid, every platform usable (%d), with %d error(s) and %d warning(s)\n", source, usable, errs, len(v.all)-errs)
	default:
		fmt.Fprintf(w, "%s: valid, every platform usable (%d)\n", source, usable)
	}
}

func (v verdict) exit(source string, strict bool) error {
	switch {
	case v.fileError:
		return fmt.Errorf("%w: %s: the file or a global setting cannot be used", errInvalidConfig, source)
	case v.unusable > 0:
		return fmt.Errorf("%w: %s: %d platform(s) unusable", errInvalidConfig, source, v.unusable)
	case strict && v.all.HasErrors():
		return fmt.Errorf("%w: %s: %d error(s) (--strict)", errInvalidConfig, source, len(v.all.Errors()))
	case strict && v.doc.Kueue != nil && v.doc.Kueue.Disagreements > 0:
		return fmt.Errorf("%w: %s: %d disagreement(s) with %s (--strict)", errInvalidConfig, source, v.doc.Kueue.Disagreements, v.doc.Kueue.Source)
	}
	return nil
}

// readConfigMapFrom reads the ConfigMap from file, or when file is empty the live one of
// namespace; it returns the client it read through then, for checks of the live cluster.
func readConfigMapFrom(ctx context.Context, file, namespace, kubeconfig string) (*corev1.ConfigMap, string, client.Reader, error) {
	if file != "" {
		cm, err := readConfigMapFile(file)
		return cm, file, nil, err
	}
	c, err := kubeClient(kubeconfig)
	if err != nil {
		return nil, "", nil, err
	}
	cm, err := liveConfigMap(ctx, c, namespace)
	if err != nil {
		return nil, "", nil, err
	}
	return cm, "configmap " + namespace + "/" + cm.Name, c, nil
}

func readConfigMap(ctx context.Context, file, namespace, kubeconfig string) (*corev1.ConfigMap, string, error) {
	cm, source, _, err := readConfigMapFrom(ctx, file, namespace, kubeconfig)
	return cm, source, err
}

// readConfigMapFile reads the one ConfigMap in a YAML (or JSON) file of one or more documents.
func readConfigMapFile(path string) (*corev1.ConfigMap, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(f), 4096)
	var found []*corev1.ConfigMap
	for {
		var cm corev1.ConfigMap
		err := dec.Decode(&cm)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: not valid YAML: %w", path, err)
		}
		if cm.Kind == "ConfigMap" {
			found = append(found, &cm)
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%s holds no ConfigMap (kind: ConfigMap)", path)
	case 1:
		return found[0], nil
	}
	var labelled []*corev1.ConfigMap
	for _, cm := range found {
		if _, ok := cm.Labels[hostconfig.ConfigLabel]; ok {
			labelled = append(labelled, cm)
		}
	}
	if len(labelled) != 1 {
		return nil, fmt.Errorf("%s holds %d ConfigMaps and %d carry the label %s; want exactly one", path, len(found), len(labelled), hostconfig.ConfigLabel)
	}
	return labelled[0], nil
}

// clusterConfig is how every command finds its cluster: the kubeconfig file given, else
// $KUBECONFIG or ~/.kube/config, else the in-cluster config of a pod; at kubeContext, or the
// kubeconfig's current context when that is empty.
func clusterConfig(kubeconfig, kubeContext string) clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
}

// restConfig reaches the cluster: in-cluster when berth runs in a pod, else through kubeconfig.
func restConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clusterConfig(kubeconfig, "").ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no cluster to talk to (in-cluster config, --kubeconfig, $KUBECONFIG or ~/.kube/config): %w", err)
	}
	return cfg, nil
}

func kubeClient(kubeconfig string) (client.Client, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: kubescheme.New()})
}

func liveConfigMap(ctx context.Context, c client.Reader, namespace string) (*corev1.ConfigMap, error) {
	var list corev1.ConfigMapList
	if err := c.List(ctx, &list, client.InNamespace(namespace), client.HasLabels{hostconfig.ConfigLabel}); err != nil {
		return nil, fmt.Errorf("listing ConfigMaps in %s: %w", namespace, err)
	}
	switch len(list.Items) {
	case 0:
		return nil, fmt.Errorf("no ConfigMap in namespace %s carries the label %s", namespace, hostconfig.ConfigLabel)
	case 1:
		return &list.Items[0], nil
	}
	return nil, fmt.Errorf("%d ConfigMaps in namespace %s carry the label %s; the controller applies none of them until only one does", len(list.Items), namespace, hostconfig.ConfigLabel)
}

// defaultNamespace is the controller's namespace: POD_NAMESPACE inside the cluster, else the
// one the manifests install into.
func defaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return hostconfig.DefaultNamespace
}
