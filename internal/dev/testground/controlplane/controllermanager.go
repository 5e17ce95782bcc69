package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A bare kube-apiserver follows no owner reference and never finishes deleting a namespace:
// both are kube-controller-manager's work. Nor does it fill the aggregated ClusterRoles
// (admin, edit, view stay without rules). The test ground runs kube-controller-manager with
// only those three controllers, so that tests see what a real cluster does after a deletion
// and a RoleBinding to `admin` grants what it grants there.

const (
	controllerManagerBinary = "kube-controller-manager"
	// controllerManagerDirPrefix names the temporary directory of its kubeconfig and log, so
	// that ReapOrphans can tell it from anything else in the temporary directory.
	controllerManagerDirPrefix = "berth-kcm-"
	controllerManagerStopWait  = 10 * time.Second
)

// controllerManager is a running kube-controller-manager.
type controllerManager struct {
	*Program
	dir string // its kubeconfig, and its log unless WithLogDir
}

// startControllerManager runs the garbage collector, the namespace controller and the ClusterRole
// aggregator, and the extra controllers, against the apiserver that kubeconfig reaches. It does
// not wait for them to sync: a deletion made before they have is still acted on once they have.
// Its log goes to logDir, or else beside its kubeconfig.
func startControllerManager(binDir string, kubeconfig []byte, logDir string, extra []string) (*controllerManager, error) {
	dir, err := os.MkdirTemp("", controllerManagerDirPrefix)
	if err != nil {
		return nil, err
	}
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if logDir == "" {
		logDir = dir
	}
	prog, err := StartProgram(filepath.Join(binDir, controllerManagerBinary), filepath.Join(logDir, controllerManagerBinary+".log"), []string{
		"--kubeconfig=" + kubeconfigPath,
		"--controllers=" + strings.Join(append([]string{"garbagecollector", "namespace", "clusterrole-aggregation"}, extra...), ","),
		"--leader-elect=false",
		// No serving endpoint: nothing probes it, and no port can clash between test packages.
		"--secure-port=0",
		"--use-service-account-credentials=false",
	}, nil)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &controllerManager{Program: prog, dir: dir}, nil
}

// stop ends kube-controller-manager and removes its directory. It reports an exit that came
// before it was asked to stop, with the end of its log: until then, tests ran without a garbage
// collector.
func (m *controllerManager) stop() error {
	return errors.Join(m.Stop(controllerManagerStopWait), os.RemoveAll(m.dir))
}
