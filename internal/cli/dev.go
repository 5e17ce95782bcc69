package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/berth-ci/berth/internal/devstack"
)

func newDevCommand() *cobra.Command {
	opts := devstack.Options{HostStep: runHostStep}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the local stack: control plane, SSH hosts and a Tekton stand-in (make run)",
		Long: `dev brings up a real kube-apiserver and etcd with Tekton's CRDs, real SSH hosts
(each an sshd in its own network and mount namespace) and a Tekton stand-in that runs
TaskRuns, prints how to reach them, and tears everything down on Ctrl-C.
Needs the binaries of 'make testbin' and, for hosts, root and openssh-server.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Ctrl-C also reaches whatever reads our output (make run | tee); once it is gone, a
			// write to stdout must not kill us with SIGPIPE halfway through the teardown.
			signal.Ignore(syscall.SIGPIPE)
			stack, err := devstack.Up(ctx, opts)
			if err != nil {
				return err
			}
			stack.Describe(cmd.OutOrStdout())
			<-ctx.Done()
			fmt.Fprintln(cmd.OutOrStdout(), "\nstopping the dev stack ...")
			// Teardown must finish even though the signal context is done.
			if err := stack.Down(); err != nil {
				return fmt.Errorf("tearing down: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "stopped; nothing left running.")
			return nil
		},
	}
	cmd.Flags().IntVar(&opts.Hosts, "hosts", 2, "SSH hosts to start (0 for none)")
	cmd.Flags().StringVar(&opts.StateDir, "state-dir", ".berth/dev", "where the kubeconfig, host admin key and known_hosts are written")
	return cmd
}

// runHostStep runs `berth host ...` in this process: how the dev stack's Tekton stand-in
// executes the provision, clean and update TaskRuns with berth's own code.
func runHostStep(ctx context.Context, args []string) error {
	cmd := NewRootCommand()
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard) // the error is returned and becomes the TaskRun's message
	return cmd.ExecuteContext(ctx)
}
