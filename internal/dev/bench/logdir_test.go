package bench

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFreshDirNeverReusesARunsLogs: a second run into the same log directory gets a directory
// of its own, so its audit log holds its own writes only.
func TestFreshDirNeverReusesARunsLogs(t *testing.T) {
	want := filepath.Join(t.TempDir(), "logs", "static-1-controller")
	var got []string
	for range 3 {
		dir, err := freshDir(want)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "audit.log"), []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		got = append(got, dir)
	}
	for i, w := range []string{want, want + "-2", want + "-3"} {
		if got[i] != w {
			t.Fatalf("run %d logged into %s, want %s (all: %v)", i+1, got[i], w, got)
		}
	}
}
