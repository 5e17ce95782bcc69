package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/pprof/profile"
	"k8s.io/client-go/rest"
)

// Pprof collects the profiles of a controller that serves net/http/pprof at Address (berth's
// --pprof-bind-address): its CPU profile over the measured part into Dir/cpu.pprof, and its
// heap at the end into Dir/heap.pprof (read either with go tool pprof). Over the same part,
// kube-apiserver's CPU profile goes to Dir/kube-apiserver-cpu.pprof (read it with the test
// ground's kube-apiserver binary), to tell what each of the controller's requests costs there.
// Without an Address (a controller that serves no pprof), only kube-apiserver is profiled.
type Pprof struct {
	Address string
	Dir     string
}

// apiServerCPUProfile is the file kube-apiserver's CPU profile is written to, in Pprof.Dir.
const apiServerCPUProfile = "kube-apiserver-cpu.pprof"

// cpuPiece is how long each CPU profile request lasts. The endpoint profiles for a duration
// fixed when asked, and the measured part's length is not known in advance: the profile is
// taken in pieces, back to back, and merged.
const cpuPiece = 5 * time.Second

// getter reads a path of a pprof endpoint.
type getter func(ctx context.Context, path string) ([]byte, error)

// profiler is a CPU profile being taken.
type profiler struct {
	get    getter
	stop   context.CancelFunc
	done   chan struct{}
	pieces []*profile.Profile
	err    error
}

// startCPU begins a CPU profile of the endpoint get reads.
func startCPU(ctx context.Context, get getter) *profiler {
	ctx, stop := context.WithCancel(ctx)
	pr := &profiler{get: get, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		for ctx.Err() == nil {
			// A piece runs to its end even once stopped: a cut request loses the piece.
			piece, err := get(context.WithoutCancel(ctx), fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(cpuPiece/time.Second)))
			if err != nil {
				pr.err = err
				return
			}
			prof, err := profile.ParseData(piece)
			if err != nil {
				pr.err = fmt.Errorf("a CPU profile piece: %w", err)
				return
			}
			pr.pieces = append(pr.pieces, prof)
		}
	}()
	return pr
}

// finish ends the CPU profile (after the piece under way) and writes it to path.
func (pr *profiler) finish(path string) error {
	pr.stop()
	<-pr.done
	if pr.err != nil || len(pr.pieces) == 0 {
		return pr.err
	}
	merged, err := profile.Merge(pr.pieces)
	if err != nil {
		return err
	}
	return writeProfile(path, merged.Write)
}

// profiling is the profiles of one measured part: the controller's and kube-apiserver's.
type profiling struct {
	p                *Pprof
	controller, kube *profiler
}

// start begins the CPU profiles of the controller and, when apiServer is set, kube-apiserver.
func (p *Pprof) start(ctx context.Context, apiServer getter) *profiling {
	pg := &profiling{p: p}
	if p.Address != "" {
		pg.controller = startCPU(ctx, p.fetch)
	}
	if apiServer != nil {
		pg.kube = startCPU(ctx, apiServer)
	}
	return pg
}

// finish ends the CPU profiles, writes them, and writes the controller's heap.
func (pg *profiling) finish(ctx context.Context) error {
	if err := os.MkdirAll(pg.p.Dir, 0o755); err != nil {
		return err
	}
	var errs []error
	if pg.kube != nil {
		if err := pg.kube.finish(filepath.Join(pg.p.Dir, apiServerCPUProfile)); err != nil {
			errs = append(errs, fmt.Errorf("kube-apiserver: %w", err))
		}
	}
	if pg.controller == nil {
		return errors.Join(errs...)
	}
	errs = append(errs, pg.controller.finish(filepath.Join(pg.p.Dir, "cpu.pprof")))
	heap, err := pg.p.fetch(ctx, "/debug/pprof/heap?gc=1")
	if err == nil {
		err = os.WriteFile(filepath.Join(pg.p.Dir, "heap.pprof"), heap, 0o644)
	}
	return errors.Join(append(errs, err)...)
}

func (p *Pprof) fetch(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Address+path, nil)
	if err != nil {
		return nil, err
	}
	return readOK(http.DefaultClient, req)
}

// apiServerGetter reads a path of kube-apiserver's own (its pprof endpoint, served with
// --profiling, its default; its /metrics) as the user of cfg, who must be allowed that
// non-resource URL.
func apiServerGetter(cfg *rest.Config) (getter, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, path string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path, nil)
		if err != nil {
			return nil, err
		}
		return readOK(hc, req)
	}, nil
}

// readOK sends req and reads the body of a 200 answer.
func readOK(hc *http.Client, req *http.Request) ([]byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL.Path, resp.Status, body)
	}
	return body, nil
}

func writeProfile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// FreeLoopbackAddress is a loopback address with a port free at the time of asking, for a
// controller's pprof endpoint.
func FreeLoopbackAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
