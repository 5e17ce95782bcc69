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
	"time"

	"github.com/google/pprof/profile"
)

// Pprof collects the profiles of a controller that serves net/http/pprof at Address (berth's
// --pprof-bind-address): its CPU profile over the measured part into Dir/cpu.pprof, and its
// heap at the end into Dir/heap.pprof (read either with go tool pprof).
type Pprof struct {
	Address string
	Dir     string
}

// cpuPiece is how long each CPU profile request lasts. The endpoint profiles for a duration
// fixed when asked, and the measured part's length is not known in advance: the profile is
// taken in pieces, back to back, and merged.
const cpuPiece = 5 * time.Second

// profiler is a CPU profile being taken.
type profiler struct {
	p      *Pprof
	stop   context.CancelFunc
	done   chan struct{}
	pieces []*profile.Profile
	err    error
}

// start begins the CPU profile.
func (p *Pprof) start(ctx context.Context) *profiler {
	ctx, stop := context.WithCancel(ctx)
	pr := &profiler{p: p, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		for ctx.Err() == nil {
			// A piece runs to its end even once stopped: a cut request loses the piece.
			piece, err := p.fetch(context.WithoutCancel(ctx), fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(cpuPiece/time.Second)))
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

// finish ends the CPU profile (after the piece under way), writes it, and writes the heap.
func (pr *profiler) finish(ctx context.Context) error {
	pr.stop()
	<-pr.done
	if err := os.MkdirAll(pr.p.Dir, 0o755); err != nil {
		return err
	}
	errs := []error{pr.err}
	if len(pr.pieces) > 0 {
		merged, err := profile.Merge(pr.pieces)
		if err == nil {
			err = writeProfile(filepath.Join(pr.p.Dir, "cpu.pprof"), merged.Write)
		}
		errs = append(errs, err)
	}
	heap, err := pr.p.fetch(ctx, "/debug/pprof/heap?gc=1")
	if err == nil {
		err = os.WriteFile(filepath.Join(pr.p.Dir, "heap.pprof"), heap, 0o644)
	}
	return errors.Join(append(errs, err)...)
}

func (p *Pprof) fetch(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Address+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
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
