package repo

import (
	"os"
	"path/filepath"
	"testing"
)

// With BERTH_BIN_DIR holding a command's binary, Build links it instead of compiling.
func TestBuildLinksABinaryBuiltBefore(t *testing.T) {
	dir := t.TempDir()
	built := filepath.Join(dir, "berth")
	if err := os.WriteFile(built, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(BinDirEnv, dir)
	out := filepath.Join(t.TempDir(), "berth")
	if err := Build("./cmd/berth", out); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(out); err != nil || target != built {
		t.Fatalf("%s links to %q (%v), want %s", out, target, err, built)
	}
}
