package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	cmd    *exec.Cmd
	dir    string
	log    *os.File
	exited chan struct{}
	err    error // how it exited, once exited is closed
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
	log, err := os.Create(filepath.Join(logDir, controllerManagerBinary+".log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, controllerManagerBinary),
		"--kubeconfig="+kubeconfigPath,
		"--controllers="+strings.Join(append([]string{"garbagecollector", "namespace", "clusterrole-aggregation"}, extra...), ","),
		"--leader-elect=false",
		// No serving endpoint: nothing probes it, and no port can clash between test packages.
		"--secure-port=0",
		"--use-service-account-credentials=false",
	)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, as envtest gives kube-apiserver and etcd: a Ctrl-C at the terminal
	// reaches only the owner (`berth dev`), which then stops the control plane in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("starting %s: %w", controllerManagerBinary, err)
	}
	m := &controllerManager{cmd: cmd, dir: dir, log: log, exited: make(chan struct{})}
	go func() {
		m.err = cmd.Wait()
		close(m.exited)
	}()
	return m, nil
}

// stop ends kube-controller-manager and removes its directory. It reports an exit that came
// before it was asked to stop, with the end of its log: until then, tests ran without a garbage
// collector.
func (m *controllerManager) stop() error {
	var early error
	select {
	case <-m.exited:
		early = fmt.Errorf("%s exited while the control plane was in use (%v): %s", controllerManagerBinary, m.err, m.logTail())
	default:
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(controllerManagerStopWait):
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	}
	return errors.Join(early, m.log.Close(), os.RemoveAll(m.dir))
}

// logTail is the last lines of its log, for an error message.
func (m *controllerManager) logTail() string { return tail(m.log.Name(), 10) }
