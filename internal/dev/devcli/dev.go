package devcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/berth-ci/berth/internal/cli"
	"github.com/berth-ci/berth/internal/controller"
	"github.com/berth-ci/berth/internal/dev/devstack"
)

func newDevCommand() *cobra.Command {
	opts := devstack.Options{HostStep: runHostStep, VMCloud: true, ClusterServices: true}
	var (
		once        bool
		metrics     string
		apply       []string
		berthBinary string
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the local stack: control plane, SSH hosts, Tekton stand-in and berth (make run)",
		Long: `dev brings up a real kube-apiserver and etcd with Tekton's CRDs and berth's RBAC, Tasks and
admission webhook (config/webhook, served by the controller on 127.0.0.1), real SSH hosts (each an sshd in its own network and mount namespace), a Tekton stand-in that
runs TaskRuns, a local VM cloud whose VMs are SSH hosts booted on demand (with an EC2 API
stand-in in front of it), and berth's controller with a sample host config: the hosts as
static hosts of linux/s390x, linux/arm64 as a dynamic platform of type aws (a VM per task,
launched through the AWS SDK and the EC2 stand-in) and linux/ppc64le as a dynamic pool of type
local-vm (two tasks per VM), and linux/amd64 as a local platform. With --clusters it also runs
stand-ins of the space and cluster-template services (a cluster is a second real kube-apiserver
and etcd). It then runs the sample TaskRuns of config/samples, and an integration pipeline's
use of an ephemeral cluster (berth-provision-space, berth-ephemeral-cluster, then kubectl
against the cluster, then deleting the run, which takes space and cluster with it), applies the files given with --apply (your own Tasks and TaskRuns: a
namespaced object without a namespace goes to "builds"), prints how to reach everything, and
tears it all down on Ctrl-C. With --once it exits after the samples have finished, 0 if they
succeeded.
It prints a line per component as it comes up and then the user TaskRuns (a table redrawn in
place on a terminal, a line per change elsewhere); logs go to <state-dir>/berth.log and
<state-dir>/logs/. Every component is watched: when one stops or fails to start, dev says which
and why, tears the rest down and exits non-zero.
Steps of berth's image run the production berth (bin/berth beside berth-dev, or --berth-binary).
Needs the binaries of 'make testbin' and 'make build', and, for hosts and step scripts, root and
openssh-server.`,
		Args: cobra.NoArgs,
		// berth's root command would send controller-runtime's logs to the terminal; dev sends
		// them to its log file (see logToFile).
		PersistentPreRun: func(*cobra.Command, []string) {},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Ctrl-C also reaches whatever reads our output (make run | tee); once it is gone, a
			// write to stdout must not kill us with SIGPIPE halfway through the teardown.
			signal.Ignore(syscall.SIGPIPE)
			var err error
			if opts.BerthBinary, err = productionBerth(berthBinary); err != nil {
				return err
			}
			development, _ := cmd.Flags().GetBool("log-development")
			logPath := filepath.Join(opts.StateDir, "berth.log")
			logFile, err := logToFile(logPath, development)
			if err != nil {
				return err
			}
			defer logFile.Close()
			con := newConsole(cmd.OutOrStdout())
			opts.LogDir = filepath.Join(opts.StateDir, "logs")
			con.Printf("berth dev: logs in %s (etcd, kube-apiserver and kube-controller-manager in %s/)", logPath, opts.LogDir)
			opts.StepOutput, opts.VMCloudLog = con, lineLogger{ctrl.Log.WithName("dev")}
			opts.Progress = func(st devstack.Step) { con.step(st.Component, st.Took, st.Detail) }
			opts.RunScripts = func(*pipelinev1.TaskRun) bool { return os.Geteuid() == 0 }
			stack, err := devstack.Up(ctx, opts)
			if err != nil {
				if ctx.Err() != nil { // Ctrl-C while it came up: no component failed
					con.Printf("\nberth dev: interrupted while the stack came up; what had started is stopped (%v)", err)
					return nil
				}
				con.failed(err)
				return err
			}
			runCtx, cancel := stack.Supervisor.Guard(ctx)
			runErr := runBerth(runCtx, stack, metrics, once, apply, con)
			cancel()
			if ctx.Err() != nil && stack.Supervisor.Err() == nil && runErr != nil {
				// Ctrl-C before the samples were done: the person stopped it, nothing failed.
				con.Printf("\nberth dev: interrupted (%v)", runErr)
				runErr = nil
			}
			err = outcome(runErr, stack.Supervisor.Err())
			con.failed(err)
			con.Printf("\nstopping the dev stack ...")
			// Teardown must finish even though the signal context is done.
			if downErr := stack.Down(); downErr != nil {
				// Told apart from the run's own failure, which stays the command's error.
				for _, line := range strings.Split(downErr.Error(), "\n") {
					con.Printf("  teardown: %s", line)
				}
				con.Printf("stopped, with the teardown errors above.")
				if err == nil {
					err = fmt.Errorf("tearing down: %w", downErr)
				}
				return err
			}
			con.Printf("stopped; nothing left running.")
			return err
		},
	}
	cmd.Flags().BoolVar(&opts.VMCloud, "vm-cloud", true, "start the local VM cloud (and its EC2 stand-in) and serve linux/arm64 (a VM per task, type aws) and linux/ppc64le (pooled VMs, type local-vm) from it")
	cmd.Flags().BoolVar(&opts.ClusterServices, "clusters", true, "serve ephemeral clusters: the real space and cluster-template CRDs (../shared/real/crds) and stand-ins of their services")
	cmd.Flags().IntVar(&opts.Hosts, "hosts", 2, "SSH hosts to start (0 for none: then no controller or samples either)")
	cmd.Flags().StringVar(&opts.StateDir, "state-dir", ".berth/dev", "where the kubeconfig, host admin key, known_hosts and logs are written")
	cmd.Flags().BoolVar(&once, "once", false, "exit once the sample TaskRuns have finished, printing a one-line summary")
	cmd.Flags().StringVar(&metrics, "metrics-bind-address", "127.0.0.1:8080", "where the controller serves its metrics (HTTPS, to a bearer token allowed get on /metrics: the stack writes one to <state-dir>/metrics.token); 0 disables them")
	cmd.Flags().StringArrayVar(&apply, "apply", nil, "a YAML file of objects to create once the stack is up, as kubectl apply -f would (repeatable)")
	cmd.Flags().StringVar(&berthBinary, "berth-binary", "", "the production berth binary that steps of berth's image run (default: the berth next to berth-dev, bin/berth)")
	return cmd
}

// productionBerth is the berth binary steps of berth's image run: flag if given, else the berth
// beside this executable. Those steps are what berth's image runs in a real cluster, so they
// run the production binary, not berth-dev.
func productionBerth(flag string) (string, error) {
	path := flag
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		path = filepath.Join(filepath.Dir(self), "berth")
	}
	info, err := os.Stat(path)
	if err == nil && (info.IsDir() || info.Mode().Perm()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		return "", fmt.Errorf("no production berth at %s (steps of berth's image run it): %w; run make build, which builds bin/berth beside bin/berth-dev, or pass --berth-binary", path, err)
	}
	return path, nil
}

// runBerth starts the controller with the sample config, runs the samples, and waits: for them
// with --once, else for Ctrl-C (or the stack's failure: ctx is guarded by its supervisor).
func runBerth(ctx context.Context, stack *devstack.Stack, metrics string, once bool, apply []string, con *console) error {
	const ctrlC = "\nPress Ctrl-C to stop; everything above is torn down."
	applyFiles := func() error {
		if len(apply) == 0 {
			return nil
		}
		objs, err := stack.ApplyFiles(ctx, apply...)
		if err != nil {
			return fmt.Errorf("--apply: %w", err)
		}
		con.Printf("  applied        %s", strings.Join(objs, ", "))
		return nil
	}
	if stack.Fleet == nil {
		stack.Describe(con)
		if err := applyFiles(); err != nil {
			return err
		}
		con.Printf(ctrlC)
		<-ctx.Done()
		return nil
	}
	began := time.Now()
	data := stack.StaticHostConfig("linux/s390x", 2, "linux/amd64")
	platforms := fmt.Sprintf("linux/s390x on %d static hosts, linux/amd64 local", len(stack.Fleet.Hosts))
	if stack.VMCloud != nil {
		stack.AddDynamicPlatform(data, devstack.DynamicPlatform, devstack.DynamicSettings{Provider: devstack.ProviderAWS, MaxInstances: 2})
		stack.AddDynamicPlatform(data, devstack.PoolPlatform, devstack.DynamicSettings{MaxInstances: 2, Concurrency: 2, MaxAgeMinutes: 10})
		platforms += fmt.Sprintf(", %s a VM each (aws), %s pooled VMs (local-vm)", devstack.DynamicPlatform, devstack.PoolPlatform)
	}
	if _, err := stack.ApplyHostConfig(ctx, data); err != nil {
		return err
	}
	con.step("host config", time.Since(began), platforms)

	began = time.Now()
	health, err := freeLocalAddress()
	if err != nil {
		return err
	}
	o := controller.DefaultOptions()
	o.MetricsAddress, o.HealthProbeAddress, o.LeaderElection = metrics, health, true
	if err := stack.StartController(o); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) && metrics != "0" {
			err = fmt.Errorf("%w (another program holds it: pass --metrics-bind-address another address, or 0 for no metrics)", err)
		}
		return err
	}
	con.step(devstack.ControllerComponent, time.Since(began), fmt.Sprintf("leader (lease %s/%s), caches synced, ready at http://%s/readyz",
		devstack.Namespace, o.LeaderElectionID, health))
	con.Printf("")
	stack.Describe(con)
	served := "no metrics (--metrics-bind-address 0)"
	if metrics != "0" {
		// As in a cluster, the metrics want a token allowed get on /metrics; the stack's scraper
		// has one, written where a person can pass it to curl.
		token, err := stack.WriteMetricsScraperToken(ctx)
		if err != nil {
			return err
		}
		url := "https://" + metrics + "/metrics"
		served = fmt.Sprintf("metrics at %s, to a token allowed to read them (self-signed certificate): curl -k -H \"Authorization: Bearer $(cat %s)\" %s", url, token, url)
	}
	con.Printf("  berth          controller as ServiceAccount %s/%s; %s", devstack.Namespace, devstack.ControllerServiceAccount, served)

	table := newTaskRunTable(con, stack.Board())
	tableCtx, stopTable := context.WithCancel(ctx)
	tableDone := make(chan struct{})
	go func() {
		defer close(tableDone)
		table.run(tableCtx)
	}()
	defer func() {
		stopTable()
		<-tableDone
		if ctx.Err() == nil { // the stack is well: show how the TaskRuns ended
			final, cancel := context.WithTimeout(ctx, 5*time.Second)
			table.refresh(final)
			cancel()
		}
		con.keepTable()
	}()

	samples, err := stack.ApplySamples(ctx)
	if err != nil {
		return err
	}
	con.Printf("  samples        %d TaskRuns in namespace %s", len(samples), devstack.SampleNamespace)
	if err := applyFiles(); err != nil {
		return err
	}
	con.Printf("")
	summary, err := stack.WaitForSamples(ctx, samples, 3*time.Minute)
	table.refresh(ctx)
	if summary != "" {
		con.Printf("berth dev: " + summary)
	}
	if err != nil {
		return err
	}
	if stack.CaaS != nil {
		summary, err := ephemeralClusterSample(ctx, stack)
		table.refresh(ctx)
		if summary != "" {
			con.Printf("berth dev: " + summary)
		}
		if err != nil {
			return err
		}
	}
	if once {
		return nil
	}
	con.Printf(ctrlC)
	<-ctx.Done()
	return nil
}

// outcome is the run's error: the component that stopped, if one did, and the run's own
// failure unless it is only that stop seen from the run.
func outcome(runErr error, failure *devstack.ComponentError) error {
	if failure == nil {
		return runErr
	}
	var ce *devstack.ComponentError
	if errors.As(runErr, &ce) {
		if ce == failure {
			return failure
		}
		if ce.Component == failure.Component {
			return runErr // the same stop, told while starting it
		}
	}
	if runErr == nil || errors.Is(runErr, context.Canceled) {
		return failure
	}
	return errors.Join(failure, fmt.Errorf("then: %w", runErr))
}

// failed tells a person what went wrong, with the last lines of the log of the component that
// stopped, before the stack is torn down.
func (c *console) failed(err error) {
	if err == nil {
		return
	}
	c.Printf("\nberth dev: %v", err)
	var ce *devstack.ComponentError
	if errors.As(err, &ce) && ce.LogTail != "" {
		c.Printf("  last lines of %s:", ce.LogPath)
		for _, line := range strings.Split(ce.LogTail, "\n") {
			c.Printf("    %s", line)
		}
	}
}

// logToFile sends controller-runtime's logs (the controller's and the stand-ins') and
// client-go's (leader election) to a new file at path.
func logToFile(path string, development bool) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	logger := cli.NewLogger(development, zap.WriteTo(f))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return f, nil
}

// lineLogger logs each line written to it (the VM cloud's and the EC2 stand-in's accounts) as an
// entry of berth.log, like every other log there.
type lineLogger struct{ log logr.Logger }

func (l lineLogger) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l.log.Info(line)
	}
	return len(p), nil
}

// freeLocalAddress is a loopback address with a port nothing listens on now.
func freeLocalAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// ephemeralClusterSample runs what an integration pipeline does with an ephemeral cluster: a
// space, a cluster from the shared template in it, kubectl against the cluster, and deleting
// the run, which takes space and cluster with it.
func ephemeralClusterSample(ctx context.Context, stack *devstack.Stack) (string, error) {
	const account = "integration-runner"
	if err := stack.InstallClusterTasks(ctx, devstack.SampleNamespace, account); err != nil {
		return "", err
	}
	start := time.Now()
	run, err := stack.RunClusterPipeline(ctx, devstack.ClusterRequest{
		Name: "integration", Namespace: devstack.SampleNamespace, ServiceAccount: account,
		Template: devstack.SharedTemplate, Use: []string{"get", "namespaces"},
	}, 5*time.Minute)
	if err != nil {
		return "", err
	}
	for _, tr := range []*pipelinev1.TaskRun{run.Space, run.Cluster, run.Use} {
		if !tr.IsSuccessful() {
			return "", fmt.Errorf("ephemeral cluster sample: TaskRun %s failed: %s", tr.Name, tr.Status.GetCondition("Succeeded").GetMessage())
		}
	}
	ready := time.Since(start)
	if err := stack.ReleaseCluster(ctx, run, 2*time.Minute); err != nil {
		return "", err
	}
	return fmt.Sprintf("ephemeral cluster %s (API %s) ready in %.1fs; kubectl get namespaces ran against it; deleting the run removed space, cluster and its control plane in %.1fs",
		run.ClusterName, run.APIServerURL, ready.Seconds(), time.Since(start.Add(ready)).Seconds()), nil
}

// runHostStep runs `berth host ...` in this process: how the dev stack's Tekton stand-in
// executes the provision, clean and update TaskRuns with the production berth's own code.
func runHostStep(ctx context.Context, args []string) error {
	cmd := cli.NewRootCommand()
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard) // the error is returned and becomes the TaskRun's message
	return cmd.ExecuteContext(ctx)
}
