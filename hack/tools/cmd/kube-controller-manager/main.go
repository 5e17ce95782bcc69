// Command kube-controller-manager is the upstream controller manager, built from the module
// proxy like kube-apiserver. The test ground runs only its garbage collector and namespace
// controller, so that owner references and namespace deletion behave as on a real cluster.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
