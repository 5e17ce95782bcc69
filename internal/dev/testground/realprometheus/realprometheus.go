// Package realprometheus runs the real Prometheus and promtool, built by `make testbin` from the
// module hack/tools/prometheus pins, for tests whose question is what operators read: that a
// scrape of berth's metrics endpoint succeeds as a ServiceMonitor configures it, that rule files
// load, and what the queries of a dashboard or an alert return for the series berth really
// exports.
package realprometheus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

const (
	startWait = time.Minute
	stopWait  = 10 * time.Second
)

// Binaries are the paths of prometheus and promtool, in controlplane.BinaryDir, or an error
// that says to run `make testbin`.
func Binaries() (prometheus, promtool string, err error) {
	dir, err := controlplane.BinaryDir()
	if err != nil {
		return "", "", err
	}
	var missing []string
	for _, name := range []string{"prometheus", "promtool"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", "", fmt.Errorf("%s missing in %s: run `make testbin` (builds them from the Go module proxy, ~14 minutes cold)", strings.Join(missing, " and "), dir)
	}
	return filepath.Join(dir, "prometheus"), filepath.Join(dir, "promtool"), nil
}

// Server is a running Prometheus.
type Server struct {
	// URL is where its HTTP API answers.
	URL  string
	API  promv1.API
	proc *controlplane.Program
}

// Start runs Prometheus with config (a prometheus.yml) and files written beside it (rule
// files, credentials), in dir, listening on a free port of 127.0.0.1. It returns once
// Prometheus says it is ready: its config and every rule file loaded (a bad one ends it, and
// the error carries its log).
func Start(ctx context.Context, dir string, config []byte, files map[string][]byte) (*Server, error) {
	bin, _, err := Binaries()
	if err != nil {
		return nil, err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), config, 0o600); err != nil {
		return nil, err
	}
	addr, err := freeAddress()
	if err != nil {
		return nil, err
	}
	proc, err := controlplane.StartProgram(bin, filepath.Join(dir, "prometheus.log"), []string{
		"--config.file=" + filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--log.level=warn",
	}, nil)
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + addr, proc: proc}
	c, err := api.NewClient(api.Config{Address: s.URL})
	if err != nil {
		_ = proc.Stop(stopWait)
		return nil, err
	}
	s.API = promv1.NewAPI(c)
	if err := s.waitReady(ctx); err != nil {
		_ = proc.Stop(stopWait)
		return nil, err
	}
	return s, nil
}

// StartForTest is Start in a temporary directory of t, stopped when t ends; its log is shown
// when t fails.
func StartForTest(t testing.TB, config []byte, files map[string][]byte) *Server {
	t.Helper()
	s, err := Start(context.Background(), t.TempDir(), config, files)
	if err != nil {
		t.Fatalf("starting Prometheus: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Prometheus' log, last lines:\n%s", s.proc.LogTail(30))
		}
		if err := s.proc.Stop(stopWait); err != nil {
			t.Errorf("stopping Prometheus: %v", err)
		}
	})
	return s
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startWait)
	defer cancel()
	for {
		if err := s.proc.Exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/-/ready", nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Prometheus not ready within %s:\n%s", startWait, s.proc.LogTail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// RuleFile is the rule file a PrometheusRule (monitoring.coreos.com/v1) stands for: its spec,
// the groups, as the Prometheus Operator writes it for Prometheus.
func RuleFile(prometheusRule []byte) ([]byte, error) {
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(prometheusRule, &rule); err != nil {
		return nil, err
	}
	if rule.Kind != "PrometheusRule" || len(rule.Spec.Groups) == 0 {
		return nil, fmt.Errorf("not a PrometheusRule with groups (kind %q, %d groups)", rule.Kind, len(rule.Spec.Groups))
	}
	return yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
}

// TestRules runs `promtool test rules` on the unit-test files in dir (each names its rule
// files relative to dir) and returns its output, with an error when a test fails.
func TestRules(ctx context.Context, dir string, tests ...string) (string, error) {
	_, promtool, err := Binaries()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, promtool, append([]string{"test", "rules"}, tests...)...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return out.String(), fmt.Errorf("promtool test rules failed (%v):\n%s", err, out.String())
	}
	return out.String(), err
}
