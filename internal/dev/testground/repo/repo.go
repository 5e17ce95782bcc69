// Package repo finds the berth checkout a test or the dev stack runs in, and what stands beside
// it (../shared). It has no dependencies, so that any test may use it cheaply.
package repo

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

const modulePath = "github.com/berth-ci/berth"

// Root is the directory holding berth's go.mod, found from the working directory upwards (go
// test runs in the package's directory).
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(data), []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the berth repository: run from its checkout (the directory holding go.mod of " + modulePath + ")")
		}
		dir = parent
	}
}

// BinDirEnv names a directory of binaries just built from this checkout (make test sets it to
// bin/ after make build): Build links a command's binary from there instead of compiling it
// again, once per test package.
const BinDirEnv = "BERTH_BIN_DIR"

// Build compiles the package pkg of this checkout (a path such as ./cmd/berth) into the file
// out; a failure carries the compiler's output. A command whose binary is in $BERTH_BIN_DIR is
// linked from there.
func Build(pkg, out string) error {
	if dir := os.Getenv(BinDirEnv); dir != "" && filepath.Dir(filepath.Clean(pkg)) == "cmd" {
		built, err := filepath.Abs(filepath.Join(dir, filepath.Base(pkg)))
		if err != nil {
			return err
		}
		if st, err := os.Stat(built); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return os.Symlink(built, out)
		}
	}
	root, err := Root()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, output)
	}
	return nil
}
