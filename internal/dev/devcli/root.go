// Package devcli is berth-dev's command line: the production berth's commands plus dev (the
// local stack, `make run`) and bench (the load harness, `make bench`). It links the test
// ground, the dev stack and the local-vm provider, which the production berth (internal/cli,
// cmd/berth) must not.
package devcli

import (
	"github.com/spf13/cobra"

	"github.com/berth-ci/berth/internal/cli"
)

// NewRootCommand returns the berth-dev command: berth's commands, with its controller also
// serving platforms of type local-vm (bench's default controller is this one), and dev and
// bench.
func NewRootCommand() *cobra.Command {
	root := cli.NewRootCommand()
	root.Use = "berth-dev"
	root.Short = "berth's development binary: berth's commands plus the local stack (dev) and the load harness (bench)"
	root.Long = `berth-dev is berth with what only development needs: dev brings up the local stack (make
run), bench measures a controller (make bench). Its controller also serves platforms of type
local-vm, the test ground's VM cloud. Steps of berth's image on the local stack run the
production berth binary (bin/berth, built beside bin/berth-dev by make build).`
	root.AddCommand(newDevCommand(), newBenchCommand(), newFloorCommand())
	return root
}
