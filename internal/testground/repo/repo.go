// Package repo finds the berth checkout a test or the dev stack runs in, and what stands beside
// it (../shared). It has no dependencies, so that any test may use it cheaply.
package repo

import (
	"bytes"
	"errors"
	"os"
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
