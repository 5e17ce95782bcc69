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
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/cluster"
)

func newClusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Ephemeral clusters for integration pipelines, one Tekton step per command",
		Long: `The steps of the berth-provision-space and berth-ephemeral-cluster Tasks: ask the space
service for a throwaway namespace (an eaas Namespace claim or a SpaceRequest), ask the cluster-templates service there for
a cluster (a ClusterTemplateInstance), wait for it, explain a failure, write its credentials to
files, and give it all back. Results go to the files the --result-* flags name, as Tekton reads
them. No command prints a kubeconfig, token or password.`,
	}
	cmd.AddCommand(newClusterProvisionSpaceCommand(), newClusterProvisionCommand(), newClusterWaitCommand(),
		newClusterDiagnoseCommand(), newClusterKubeconfigCommand(), newClusterRequireReadyCommand(), newClusterDeprovisionCommand())
	return cmd
}

// tenantFlags reach the tenant's namespace, where the TaskRun runs: in a Tekton step, the
// in-cluster config of the TaskRun's ServiceAccount.
type tenantFlags struct{ kubeconfig, namespace string }

func (f *tenantFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the tenant's cluster (default: in-cluster, $KUBECONFIG or ~/.kube/config)")
	cmd.Flags().StringVar(&f.namespace, "namespace", "", "the tenant namespace (default: the in-cluster or kubeconfig namespace)")
}

func (f *tenantFlags) client() (client.Client, string, error) {
	c, err := kubeClient(f.kubeconfig)
	if err != nil {
		return nil, "", err
	}
	if f.namespace != "" {
		return c, f.namespace, nil
	}
	ns, _, err := clusterConfig(f.kubeconfig, "").Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("finding the tenant namespace (give --namespace): %w", err)
	}
	return c, ns, nil
}

// spaceFlags reach a space namespace: its kubeconfig as a file (a Tekton step mounts the
// space's Secret) or the Secret itself, read with the tenant's credentials.
type spaceFlags struct {
	tenant                    tenantFlags
	kubeconfig, secret, space string
}

func (f *spaceFlags) register(cmd *cobra.Command) {
	f.tenant.register(cmd)
	cmd.Flags().StringVar(&f.kubeconfig, "space-kubeconfig", "", "file holding the space's kubeconfig (the key kubeconfig of the space's Secret)")
	cmd.Flags().StringVar(&f.secret, "space-secret", "", "the space's Secret in the tenant namespace (the secretRef result of provision-space)")
	cmd.Flags().StringVar(&f.space, "space-namespace", "", "the space namespace (default: the one the space's kubeconfig names)")
	cmd.MarkFlagsMutuallyExclusive("space-kubeconfig", "space-secret")
}

// registerRequired is register for a step that cannot run without the space: one of
// --space-kubeconfig and --space-secret must be given.
func (f *spaceFlags) registerRequired(cmd *cobra.Command) {
	f.register(cmd)
	cmd.MarkFlagsOneRequired("space-kubeconfig", "space-secret")
}

func (f *spaceFlags) given() bool { return f.kubeconfig != "" || f.secret != "" }

func (f *spaceFlags) connect(ctx context.Context) (*cluster.Space, error) {
	switch {
	case f.kubeconfig != "":
		raw, err := os.ReadFile(f.kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("reading the space kubeconfig: %w", err)
		}
		return cluster.SpaceFromKubeconfig(raw, f.space)
	case f.secret != "":
		tenant, ns, err := f.tenant.client()
		if err != nil {
			return nil, err
		}
		return cluster.SpaceFromSecret(ctx, tenant, cluster.SpaceAccess{Namespace: f.space, TenantNamespace: ns, SecretName: f.secret})
	}
	return nil, errors.New("no space to act in: give --space-kubeconfig or --space-secret")
}

// pollFlags bound a wait.
type pollFlags struct{ timeout, interval time.Duration }

func (f *pollFlags) register(cmd *cobra.Command, timeout time.Duration, what string) {
	cmd.Flags().DurationVar(&f.timeout, "timeout", timeout, "how long to wait for "+what)
	// A look is one GET of one object: every 2 seconds costs the apiserver nothing and keeps a
	// pipeline from idling up to a poll's length after its cluster is ready.
	cmd.Flags().DurationVar(&f.interval, "poll-interval", 2*time.Second, "how often to look")
}

func (f *pollFlags) polling() cluster.Polling {
	return cluster.Polling{Timeout: f.timeout, Interval: f.interval}
}

// writeResult writes a Tekton result file, if one is asked for.
func writeResult(path, value string) error {
	if path == "" {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("writing the result %s: %w", path, err)
	}
	return nil
}

// waitStepFailed reads the exit code Tekton recorded for the wait step (its
// $(steps.step-wait.exitCode.path)); anything but 0, or no record at all, is a failure.
func waitStepFailed(path string) (bool, string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return true, fmt.Sprintf("unknown: %v", err)
	}
	code := strings.TrimSpace(string(raw))
	return code != "0", code
}

func newClusterProvisionSpaceCommand() *cobra.Command {
	var (
		tf                                                         tenantFlags
		pf                                                         pollFlags
		req                                                        cluster.SpaceRequest
		api, ownerUID, secretRefResult, namespaceResult, urlResult string
	)
	cmd := &cobra.Command{
		Use:   "provision-space",
		Short: "Ask for a space (an eaas Namespace claim or a SpaceRequest, owned by the run) and wait until it is ready",
		Long: `provision-space asks the space service for a namespace, owned by the PipelineRun or TaskRun
given (deleting the run deletes the space), and waits until it is ready. It asks with the API
--api names: namespace-claim creates an eaas.konflux-ci.dev Namespace claim as Konflux's own
eaas-provision-space does (its kubeconfig goes to Secret <name>-secret); spacerequest creates a
SpaceRequest of --tier; auto (the default) takes the one the cluster serves, the claim when it
serves both, and says which. A re-run with the same --space-request reuses what it made. A
SpaceRequest the service cannot serve fails at once with the service's message; a claim is
waited for while Crossplane retries it. The Secret with the space's kubeconfig goes to
--result-secret-ref-file, the space namespace to --result-namespace-file.`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			var err error
			req.API, err = cluster.ParseSpaceAPI(api)
			return err
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			tenant, ns, err := tf.client()
			if err != nil {
				return err
			}
			req.Namespace, req.Owner.UID = ns, types.UID(ownerUID)
			out := cmd.OutOrStdout()
			access, err := cluster.ProvisionSpace(cmd.Context(), tenant, req, pf.polling(), out)
			if err != nil {
				return err
			}
			if access.Namespace == "" {
				fmt.Fprintf(out, "the space is ready; its kubeconfig is in Secret %s/%s, which names no namespace\n", access.TenantNamespace, access.SecretName)
			} else {
				fmt.Fprintf(out, "space %s is ready; its kubeconfig is in Secret %s/%s\n", access.Namespace, access.TenantNamespace, access.SecretName)
			}
			return errors.Join(writeResult(secretRefResult, access.SecretName), writeResult(namespaceResult, access.Namespace), writeResult(urlResult, access.ClusterURL))
		},
	}
	tf.register(cmd)
	pf.register(cmd, 5*time.Minute, "the space")
	f := cmd.Flags()
	f.StringVar(&api, "api", string(cluster.SpaceAPIAuto), "the API to ask with: auto (the one the cluster serves, the claim first), namespace-claim or spacerequest")
	f.StringVar(&req.Name, "space-request", "", "the name of the claim or SpaceRequest; a re-run with the same name reuses it (a Task gives its TaskRun's name)")
	f.StringVar(&req.TierName, "tier", "", "the space tier (spec.tierName of a SpaceRequest; a claim has none)")
	f.StringVar(&req.Owner.Kind, "owner-kind", "PipelineRun", "the kind of the owning run: PipelineRun or TaskRun")
	f.StringVar(&req.Owner.Name, "owner-name", "", "the owning run's name")
	f.StringVar(&ownerUID, "owner-uid", "", "the owning run's UID")
	f.StringVar(&secretRefResult, "result-secret-ref-file", "", "file to write the name of the space's Secret to (the secretRef result)")
	f.StringVar(&namespaceResult, "result-namespace-file", "", "file to write the space namespace to (the namespace result)")
	f.StringVar(&urlResult, "result-cluster-url-file", "", "file to write the URL of the cluster the space is on to")
	for _, name := range []string{"space-request", "owner-name", "owner-uid"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func newClusterProvisionCommand() *cobra.Command {
	var (
		sf                            spaceFlags
		req                           cluster.ClusterRequest
		credentialsSecret, nameResult string
	)
	cmd := &cobra.Command{
		Use:   "provision [name=value ...]",
		Short: "Ask for a cluster in a space (a ClusterTemplateInstance); each argument is a further template parameter",
		Long: `provision creates a ClusterTemplateInstance of --template in the space, with the parameters
version, instanceType and timeout (when given) and every name=value argument. A re-run with the
same --cluster-name finds the instance it made before. It reads the space's
ClusterTemplateQuota first and fails at once when the template is not allowed or the quota has
no room; the cluster service may still refuse at admission, which is reported as a refusal.
For a bring-your-own-cloud template, --credentials-secret names a Secret in the tenant
namespace that is copied into the space and passed as the parameter credentialsSecret.`,
		Args: func(_ *cobra.Command, args []string) error {
			for _, a := range args {
				if _, err := cluster.ParseParameter(a); err != nil {
					return err
				}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, a := range args {
				p, _ := cluster.ParseParameter(a) // checked by Args
				req.Parameters = append(req.Parameters, p)
			}
			if credentialsSecret != "" {
				tenant, ns, err := sf.tenant.client()
				if err != nil {
					return err
				}
				if req.Credentials, err = cluster.ReadCredentials(cmd.Context(), tenant, ns, credentialsSecret); err != nil {
					return err
				}
			}
			space, err := sf.connect(cmd.Context())
			if err != nil {
				return err
			}
			inst, err := cluster.Provision(cmd.Context(), space, req, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			return writeResult(nameResult, inst.Name)
		},
	}
	sf.registerRequired(cmd)
	f := cmd.Flags()
	f.StringVar(&req.Name, "cluster-name", "", "the ClusterTemplateInstance's name; a re-run with the same name finds it (a Task gives its TaskRun's name)")
	f.StringVar(&req.Template, "template", "", "the ClusterTemplate to make the cluster from")
	f.StringVar(&req.Version, "version", "", "the template parameter version (empty: the template's default)")
	f.StringVar(&req.InstanceType, "instance-type", "", "the template parameter instanceType (empty: the template's default)")
	f.StringVar(&req.Timeout, "timeout", "", "the template parameter timeout: how long the service may take to install (empty: the template's default)")
	f.StringVar(&credentialsSecret, "credentials-secret", "", "bring your own cloud: a Secret in the tenant namespace with the cloud credentials (empty: the template's shared credentials)")
	f.StringVar(&nameResult, "result-cluster-name-file", "", "file to write the cluster's name to (the clusterName result)")
	_ = cmd.MarkFlagRequired("cluster-name")
	_ = cmd.MarkFlagRequired("template")
	return cmd
}

func newClusterWaitCommand() *cobra.Command {
	var (
		sf   spaceFlags
		pf   pollFlags
		name string
	)
	cmd := &cobra.Command{
		Use:   "wait",
		Short: "Wait until a cluster is ready, printing each change of its phase",
		Long: `wait follows a ClusterTemplateInstance until its phase is Ready with a Ready condition that
is True, printing a line (with the time since the start) whenever its phase or message changes.
A failure phase or failed condition ends it at once with the service's message; a timeout says
which phase the cluster was stuck in. In berth-ephemeral-cluster it runs with onError:
continue, so that the diagnose step can explain a failure.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			space, err := sf.connect(cmd.Context())
			if err != nil {
				return err
			}
			_, err = cluster.Wait(cmd.Context(), space, name, pf.polling(), cmd.OutOrStdout())
			return err
		},
	}
	sf.registerRequired(cmd)
	pf.register(cmd, 30*time.Minute, "the cluster")
	cmd.Flags().StringVar(&name, "cluster-name", "", "the ClusterTemplateInstance to wait for")
	_ = cmd.MarkFlagRequired("cluster-name")
	return cmd
}

func newClusterDiagnoseCommand() *cobra.Command {
	var (
		sf                 spaceFlags
		name, waitExitCode string
	)
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Explain why a cluster is not ready: its status, quota, Events, install Jobs and Pods",
		Long: `diagnose writes a report on a ClusterTemplateInstance: its phase, message and conditions, its
template and the space's quota, the Events of the space namespace (the cluster's first), and
the install's Jobs and Pods with each container's state and log tail (or, where the log cannot
be read, its termination message). It prints no Secret. With --wait-exit-code-file it reports
only when the wait step failed. It exits non-zero when part of the report could not be read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if waitExitCode != "" {
				if failed, code := waitStepFailed(waitExitCode); !failed {
					fmt.Fprintf(cmd.OutOrStdout(), "the wait step succeeded (exit code %s); nothing to diagnose\n", code)
					return nil
				}
			}
			space, err := sf.connect(cmd.Context())
			if err != nil {
				return err
			}
			if err := cluster.Diagnose(cmd.Context(), space, name, cmd.OutOrStdout()); err != nil {
				return fmt.Errorf("the report above is incomplete: %w", err)
			}
			return nil
		},
	}
	sf.registerRequired(cmd)
	cmd.Flags().StringVar(&name, "cluster-name", "", "the ClusterTemplateInstance to explain")
	cmd.Flags().StringVar(&waitExitCode, "wait-exit-code-file", "", "the wait step's exit code file ($(steps.step-wait.exitCode.path)): report only if it is not 0")
	_ = cmd.MarkFlagRequired("cluster-name")
	return cmd
}

func newClusterKubeconfigCommand() *cobra.Command {
	var (
		sf                                                 spaceFlags
		name, dir, waitExitCode, urlResult, kubeconfResult string
	)
	cmd := &cobra.Command{
		Use:   "kubeconfig",
		Short: "Write a ready cluster's kubeconfig and admin credentials to files only their owner may read",
		Long: `kubeconfig writes the kubeconfig of a ready cluster and its admin user's name and password to
<credentials-dir>/<cluster-name>/kubeconfig, username and password (mode 0600), never to the
log. The API URL goes to --result-api-url-file, the kubeconfig's path relative to
--credentials-dir to --result-kubeconfig-file. With --wait-exit-code-file it writes nothing
when the wait step failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if waitExitCode != "" {
				if failed, code := waitStepFailed(waitExitCode); failed {
					fmt.Fprintf(cmd.OutOrStdout(), "the wait step failed (exit code %s); the cluster has no credentials to write\n", code)
					return nil
				}
			}
			space, err := sf.connect(cmd.Context())
			if err != nil {
				return err
			}
			rel := filepath.Join(name, "kubeconfig")
			to := cluster.CredentialFiles{Kubeconfig: filepath.Join(dir, rel),
				Username: filepath.Join(dir, name, "username"), Password: filepath.Join(dir, name, "password")}
			url, err := cluster.Kubeconfig(cmd.Context(), space, name, to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the credentials of cluster %s (%s) to %s\n", name, url, filepath.Join(dir, name))
			return errors.Join(writeResult(urlResult, url), writeResult(kubeconfResult, rel))
		},
	}
	sf.registerRequired(cmd)
	f := cmd.Flags()
	f.StringVar(&name, "cluster-name", "", "the ready ClusterTemplateInstance")
	f.StringVar(&dir, "credentials-dir", "", "directory to write <cluster-name>/kubeconfig, username and password into (the credentials workspace)")
	f.StringVar(&urlResult, "result-api-url-file", "", "file to write the cluster's API URL to (the apiServerURL result)")
	f.StringVar(&kubeconfResult, "result-kubeconfig-file", "", "file to write the kubeconfig's path relative to --credentials-dir to (the kubeconfig result)")
	f.StringVar(&waitExitCode, "wait-exit-code-file", "", "the wait step's exit code file ($(steps.step-wait.exitCode.path)): write nothing unless it is 0")
	_ = cmd.MarkFlagRequired("cluster-name")
	_ = cmd.MarkFlagRequired("credentials-dir")
	return cmd
}

func newClusterRequireReadyCommand() *cobra.Command {
	var (
		sf                 spaceFlags
		name, waitExitCode string
	)
	cmd := &cobra.Command{
		Use:   "require-ready",
		Short: "Fail when the wait step failed: the last step of berth-ephemeral-cluster",
		Long: `require-ready exits non-zero when the wait step's exit code file says it failed, so that the
TaskRun fails after the diagnose step has had its say. With the space flags it names the
cluster's phase and message as they are now.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			failed, code := waitStepFailed(waitExitCode)
			if !failed {
				fmt.Fprintf(cmd.OutOrStdout(), "cluster %s is ready\n", name)
				return nil
			}
			now := ""
			if sf.given() {
				now = "; " + currentState(cmd.Context(), &sf, name)
			}
			return fmt.Errorf("cluster %s did not become ready (the wait step exited with %s)%s; the wait and diagnose steps' logs say why", name, code, now)
		},
	}
	sf.register(cmd)
	cmd.Flags().StringVar(&name, "cluster-name", "", "the ClusterTemplateInstance")
	cmd.Flags().StringVar(&waitExitCode, "wait-exit-code-file", "", "the wait step's exit code file ($(steps.step-wait.exitCode.path))")
	_ = cmd.MarkFlagRequired("cluster-name")
	_ = cmd.MarkFlagRequired("wait-exit-code-file")
	return cmd
}

// currentState is a cluster's phase and message now, or why they cannot be read.
func currentState(ctx context.Context, sf *spaceFlags, name string) string {
	space, err := sf.connect(ctx)
	if err != nil {
		return fmt.Sprintf("its state is unknown: %v", err)
	}
	inst, err := cluster.Lookup(ctx, space, name)
	if err != nil {
		return fmt.Sprintf("its state is unknown: %v", err)
	}
	msg := ""
	if inst.Message != "" {
		msg = ": " + inst.Message
	}
	return fmt.Sprintf("it is in phase %s%s", inst.Phase, msg)
}

func newClusterDeprovisionCommand() *cobra.Command {
	var (
		sf                             spaceFlags
		pf                             pollFlags
		name, spaceRequest, spaceClaim string
	)
	cmd := &cobra.Command{
		Use:   "deprovision",
		Short: "Give a cluster back (delete its ClusterTemplateInstance) and/or the space (delete its claim or SpaceRequest)",
		Long: `deprovision deletes the ClusterTemplateInstance --cluster-name in the space and waits until the
service has torn the cluster down and the instance is gone; then, with --space-claim or
--space-request, it deletes the eaas Namespace claim or the SpaceRequest in the tenant namespace
(and so the space and all in it) and waits until it is gone. What is gone already counts as
given back.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if name != "" {
				space, err := sf.connect(cmd.Context())
				if err != nil {
					return err
				}
				if err := cluster.Deprovision(cmd.Context(), space, name, pf.polling(), out); err != nil {
					return err
				}
			}
			if spaceRequest == "" && spaceClaim == "" {
				return nil
			}
			tenant, ns, err := sf.tenant.client()
			if err != nil {
				return err
			}
			if spaceClaim != "" {
				return cluster.ReleaseClaim(cmd.Context(), tenant, ns, spaceClaim, pf.polling(), out)
			}
			return cluster.ReleaseSpace(cmd.Context(), tenant, ns, spaceRequest, pf.polling(), out)
		},
	}
	sf.register(cmd)
	pf.register(cmd, 30*time.Minute, "each deletion to finish")
	cmd.Flags().StringVar(&name, "cluster-name", "", "the ClusterTemplateInstance to delete (needs --space-kubeconfig or --space-secret)")
	cmd.Flags().StringVar(&spaceClaim, "space-claim", "", "the eaas Namespace claim to delete, in the tenant namespace")
	cmd.Flags().StringVar(&spaceRequest, "space-request", "", "the SpaceRequest to delete, in the tenant namespace")
	cmd.MarkFlagsMutuallyExclusive("space-claim", "space-request")
	cmd.MarkFlagsOneRequired("cluster-name", "space-claim", "space-request")
	return cmd
}
