package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/controller/hostconfig"
	"github.com/berth-ci/berth/internal/kubescheme"
)

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with the host-config ConfigMap",
	}
	cmd.AddCommand(newConfigValidateCommand())
	return cmd
}

func newConfigValidateCommand() *cobra.Command {
	var file, namespace, kubeconfig string
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a host-config ConfigMap: every problem with its key; non-zero exit on errors",
		Long: `validate checks the host-config ConfigMap the way the controller does before it puts a
config in force, and prints every problem with the key it is about.

With -f it reads a ConfigMap from a YAML file; without, it reads the live ConfigMap labelled
` + hostconfig.ConfigLabel + ` in --namespace through your kubeconfig, and also checks that
the secrets the config names exist and hold the keys berth needs.

It exits 1 when there are errors and 0 when there are only warnings.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				cm       *corev1.ConfigMap
				extra    config.Problems
				source   string
				err      error
				ctx      = cmd.Context()
				liveRead client.Reader
			)
			if file != "" {
				cm, err = readConfigMapFile(file)
				source = file
			} else {
				liveRead, err = kubeClient(kubeconfig)
				if err == nil {
					cm, err = liveConfigMap(ctx, liveRead, namespace)
					source = "configmap " + namespace + "/"
					if cm != nil {
						source += cm.Name
					}
				}
			}
			if err != nil {
				return err
			}
			if _, ok := cm.Labels[hostconfig.ConfigLabel]; !ok {
				extra = append(extra, config.Problem{Severity: config.Warning, Key: "metadata.labels",
					Message: "no " + hostconfig.ConfigLabel + " label: the controller finds its config by this label and would not see this ConfigMap"})
			}
			cfg, problems := config.Parse(cm.Data)
			if liveRead != nil && !problems.HasErrors() {
				extra = append(extra, hostconfig.MissingSecrets(ctx, liveRead, namespace, cfg)...)
			}
			return report(cmd.OutOrStdout(), source, append(problems, extra...))
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "a YAML file holding the ConfigMap (default: the live one)")
	cmd.Flags().StringVarP(&namespace, "namespace", "n", defaultNamespace(), "the controller's namespace, for the live ConfigMap")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	return cmd
}

var errInvalidConfig = errors.New("invalid config")

func report(w io.Writer, source string, problems config.Problems) error {
	errs := 0
	for _, p := range problems {
		fmt.Fprintln(w, p.String())
		if p.Severity == config.Error {
			errs++
		}
	}
	warnings := len(problems) - errs
	switch {
	case errs > 0:
		fmt.Fprintf(w, "%s: %d error(s), %d warning(s): the controller would keep its last good config\n", source, errs, warnings)
		return fmt.Errorf("%w: %s has %d error(s)", errInvalidConfig, source, errs)
	case warnings > 0:
		fmt.Fprintf(w, "%s: valid, with %d warning(s)\n", source, warnings)
	default:
		fmt.Fprintf(w, "%s: valid\n", source)
	}
	return nil
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

// restConfig reaches the cluster: in-cluster when berth runs in a pod, else through kubeconfig.
func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
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
