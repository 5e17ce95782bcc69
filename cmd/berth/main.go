// Command berth is the berth controller and its helper commands.
package main

import (
	"os"

	"github.com/berth-ci/berth/internal/cli"
)

func main() {
	if err := cli.NewRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}
