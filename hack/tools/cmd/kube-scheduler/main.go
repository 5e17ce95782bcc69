// Command kube-scheduler is the upstream scheduler, built from the module proxy like
// kube-apiserver. The real Tekton of the test ground (internal/dev/testground/realtekton) needs
// it: Tekton's pods reach a node, and so kwok's fake kubelet, only once they are scheduled.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
