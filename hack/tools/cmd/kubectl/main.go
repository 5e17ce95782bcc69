// Command kubectl is the upstream client, built from the module proxy like the control plane
// beside it: the Tekton stand-in supplies it to steps of the kubectl image, so Tasks that talk
// to an ephemeral cluster run the real kubectl against a real second apiserver.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	os.Exit(cli.Run(cmd.NewDefaultKubectlCommand()))
}
