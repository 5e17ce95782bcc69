// Command berth-dev is berth plus its development commands: dev (the local stack, make run)
// and bench (the load harness, make bench). The production binary is cmd/berth.
package main

import (
	"os"

	"github.com/berth-ci/berth/internal/dev/devcli"
)

func main() {
	if err := devcli.NewRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
