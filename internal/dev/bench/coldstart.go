package bench

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// evictExecutable drops the pages of the command's executable from the page cache, so that
// the controller starts the way a pod's container does, from a binary the node reads in as it
// runs it, and any two controllers are measured alike. On each page a program touches, the
// kernel also maps cached pages around it, so a binary cached whole (just built) counts more
// pages: the same berth binary peaked at 95.5 to 97.6 MiB on static ×0.25 right after its
// build and at 82.7 MiB once its pages were dropped (docs/bench.md). Pages another process
// has mapped stay (the harness's own binary, when it is the controller too).
func evictExecutable(command string) error {
	path, err := exec.LookPath(executableOf(command))
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// Only clean pages can be dropped: write back what the build left dirty first.
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing back %s: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping %s from the page cache: %w", path, err)
	}
	return nil
}

// executableOf is the program a shell command line runs: its first word, past `env` and the
// variables it sets.
func executableOf(command string) string {
	words := strings.Fields(command)
	for i, w := range words {
		if w == "env" || w == "exec" || strings.Contains(w, "=") {
			continue
		}
		return words[i]
	}
	return ""
}
