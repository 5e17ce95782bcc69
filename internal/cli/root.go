// Package cli is the production berth's command line: one cobra command per real capability.
// The development commands (dev, bench) are berth-dev's, in internal/dev/devcli.
package cli

import (
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// KubectlPlugin is the name under which kubectl runs berth (a link to it on PATH) for
// `kubectl berth ...`.
const KubectlPlugin = "kubectl-berth"

// NewLogger is the logger of every berth process: JSON, or human-readable when development,
// stamped to the nanosecond (a hand-over takes milliseconds; a log in seconds cannot show
// where one waited). A logger's values are encoded only when it logs (deferValues).
func NewLogger(development bool, opts ...zap.Opts) logr.Logger {
	stamp := func(o *zap.Options) { o.TimeEncoder = zapcore.RFC3339NanoTimeEncoder }
	return logr.New(deferValues(zap.New(append([]zap.Opts{zap.UseDevMode(development), stamp}, opts...)...).GetSink()))
}

// NewRootCommand returns the berth command with all its subcommands.
func NewRootCommand() *cobra.Command {
	var development bool
	root := &cobra.Command{
		Use:   "berth",
		Short: "berth gives Tekton tasks hosts of the platforms their cluster lacks",
		Long: `berth satisfies TaskRuns that ask for a platform (PLATFORM=linux/s390x) with a local
node, a slot on a static SSH host or a cloud VM, and hands each a throwaway user and key
through the multi-platform-ssh-<taskrun> secret.`,
		SilenceUsage:  true,
		SilenceErrors: false,
		PersistentPreRun: func(*cobra.Command, []string) {
			ctrl.SetLogger(NewLogger(development))
		},
	}
	root.PersistentFlags().BoolVar(&development, "log-development", false, "human-readable, verbose logs")
	root.AddCommand(newControllerCommand(), newOTPServerCommand(), newConfigCommand(), newHostCommand(), newClusterCommand(), newStatusCommand(),
		newTaskgenCommand(), newVersionCommand())
	if filepath.Base(os.Args[0]) == KubectlPlugin {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl berth"}
	}
	return root
}
