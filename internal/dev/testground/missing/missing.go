// Package missing says what a test does when the machine lacks something it needs (root, a
// binary, a kernel feature): outside CI it skips and says what is missing; in CI (CI=true),
// whose machine installs everything, a skip would hide that the test did not run, so it fails.
package missing

import (
	"fmt"
	"os"
	"testing"
)

// InCI tells whether the tests run in CI.
func InCI() bool { return os.Getenv("CI") == "true" }

// Skip skips t for want of what why says; in CI it fails t.
func Skip(t testing.TB, why any) {
	t.Helper()
	if InCI() {
		t.Fatal(why)
		return
	}
	t.Skip(why)
}

// Main is Skip for a TestMain, which has no t: it says why on standard error and returns the
// exit code, 1 in CI and 0 elsewhere.
func Main(why any) int {
	if InCI() {
		fmt.Fprintln(os.Stderr, "FAIL:", why)
		return 1
	}
	fmt.Fprintln(os.Stderr, "skipping:", why)
	return 0
}
