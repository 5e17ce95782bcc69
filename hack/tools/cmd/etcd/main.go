// Command etcd is the upstream etcd server, built at the version kube-apiserver expects.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
