package devcli

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/berth-ci/berth/internal/bench"
)

func newBenchCommand() *cobra.Command {
	var (
		scenario, controllerCmd, baseline, provisioner string
		scale                                          float64
		asJSON                                         bool
		chaos                                          int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure a multi-platform controller on a real control plane (make bench)",
		Long: `bench starts a real kube-apiserver and etcd, writes the scenario's host-config ConfigMap
(labelled build.appstudio.redhat.com/multi-platform-config, in namespace berth-system) and
host admin secret, and runs the controller under test as a child process with KUBECONFIG
(cluster admin) and POD_NAMESPACE=berth-system. A simulation plays Tekton and the hosts by
the contract alone: it resolves user TaskRuns, completes a provision TaskRun (any
task-type=provision TaskRun, whatever Task it references: by creating the secret its
SECRET_NAME param names in NAMESPACE with host=USER@HOST, or, with berth's USER_NAME param,
with a user-dir result), completes clean and update TaskRuns, and completes each user TaskRun
1-3 s after its secret appears. Every simulated host is also an SSH endpoint on loopback
(pinned host key, the admin secret's key) that answers berth's host commands at once, for a
controller that provisions over SSH itself (berth's default, --provisioner=ssh). Each result
says which way the hosts were reached. Any controller that keeps the contract can be measured
like for like; it must find its config by the label in $POD_NAMESPACE and need nothing else
installed. A run that serves no task fails.

Scenarios: static (50 hosts x 4, 2,000 TaskRuns in a burst), idle-cluster (20,000
unrelated TaskRuns present, then 10 hosts x 2 and 100 TaskRuns: the controller's memory with
a big cluster), dynamic (a VM per task: 200 TaskRuns, max-instances 20) and dynamic-pool
(VMs shared by 4 tasks each: 2,000 TaskRuns, max-instances 12, max-age 2 h). --scale
multiplies hosts, task counts and max-instances (at least 2).

The dynamic scenarios start a local VM cloud in the bench process, whose VMs are real SSH
hosts (root, sshd, iproute2 and util-linux needed; about 1.5 s to boot), and configure the
platform as type local-vm on it (endpoint, its API key in Secret vm-cloud-credentials, key
api-key; ssh-secret host-admin-key, whose key the VMs accept for root; check-interval 1,
allocation-timeout 3600). They also report, from the cloud's own account of every instance:
instancesLaunched, peakInstances and maxInstancesExceeded (launches that took the platform
above max-instances), doubleLaunches (a launch token used twice, or a record's instance
launched while another of the same record was up), leakedInstances (up after the run and up
to 2 minutes of settling while no BuildHost record holds them, or their record is retired or
past max-age; pool VMs with a live record are not leaks), singleUseVmsReused and
vmReadyToSecretMs (from an instance becoming running in the cloud to the first secret of a
task assigned to it).

--chaos N kills the controller (SIGKILL) N times during the run, after random numbers of
served tasks plus up to a second, and starts it again at once with the same command;
controllerKills counts the kills. The cloud and the simulation live on. Over-commit is
checked in every scenario: no host or VM (named by its BuildHost record) is ever assigned more
tasks at once than its slots. userTaskWarnings counts the Warning events on the user
TaskRuns by reason: a run has nothing that deserves one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc, err := bench.ScenarioNamed(scenario, scale)
			if err != nil {
				return err
			}
			sc.Chaos = chaos
			if controllerCmd == "" {
				// berth-dev's own controller: the production berth's, which cannot serve the
				// dynamic scenarios' platforms of type local-vm. No scenario has a local
				// platform, and the bench's control plane calls no webhook: it serves none.
				self, err := os.Executable()
				if err != nil {
					return err
				}
				controllerCmd = self + " controller --metrics-bind-address=0 --health-probe-bind-address=0 --webhook-port=0 --host-check-interval=0 --provisioner=" + provisioner
			}
			commands := []string{controllerCmd}
			if baseline != "" {
				commands = append([]string{baseline}, commands...)
			}
			var results []*bench.Result
			for _, c := range commands {
				res, err := bench.Run(cmd.Context(), sc, c, cmd.ErrOrStderr())
				if err != nil {
					if res != nil {
						// What a failed run measured helps to find why it failed.
						enc := json.NewEncoder(cmd.ErrOrStderr())
						enc.SetIndent("", "  ")
						_ = enc.Encode(res)
					}
					return fmt.Errorf("%s: %w", c, err)
				}
				results = append(results, res)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(results)
			}
			bench.PrintTable(cmd.OutOrStdout(), results)
			return nil
		},
	}
	cmd.Flags().StringVar(&scenario, "scenario", "static", "static, idle-cluster, dynamic or dynamic-pool")
	cmd.Flags().Float64Var(&scale, "scale", 1, "multiply the scenario's hosts and task counts (0.1 for a quick run)")
	cmd.Flags().StringVar(&controllerCmd, "controller", "", "command line of the controller under test (default: berth-dev's controller, berth's plus the local-vm provider the dynamic scenarios use)")
	cmd.Flags().StringVar(&baseline, "baseline", "", "command line of another controller to run first on the same scenario, for ratios")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the results as JSON")
	cmd.Flags().IntVar(&chaos, "chaos", 0, "kill the controller (SIGKILL) this many times at random moments of the run, starting it again at once")
	cmd.Flags().StringVar(&provisioner, "provisioner", "ssh", "how this berth's controller reaches the hosts: ssh or taskrun (ignored with --controller)")
	return cmd
}
