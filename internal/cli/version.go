package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/berth-ci/berth/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print which build of berth this is: version, commit, Go version, platform",
		Long: `version prints one "key: value" line each for the version (what git describe --tags
--always --dirty said when make build or make image built the binary; an untagged commit is its
short hash, -dirty when the checkout had uncommitted changes), the full commit, the Go release
that compiled it and its GOOS/GOARCH. A binary built without make says what Go recorded: after
go build in a checkout, the short commit; after go run or go test, "devel" and commit "unknown".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			i := version.Get()
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "version: %s\ncommit: %s\ngo: %s\nplatform: %s\n", i.Version, i.Commit, i.GoVersion, i.Platform)
			return err
		},
	}
}
