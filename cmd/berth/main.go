// Command berth is the berth controller and its helper commands.
package main

import (
	"os"

	"github.com/berth-ci/berth/internal/cli"
	// Cloud providers register themselves: one line per provider type.
	_ "github.com/berth-ci/berth/internal/cloud/localvm"
)

func main() {
	if err := cli.NewRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
