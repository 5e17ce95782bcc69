package missing

import (
	"testing"
)

// recorder is a testing.TB that notes whether it was failed or skipped.
type recorder struct {
	testing.TB
	failed, skipped bool
}

func (r *recorder) Helper()      {}
func (r *recorder) Fatal(...any) { r.failed = true }
func (r *recorder) Skip(...any)  { r.skipped = true }

func TestSkipFailsInCIAndSkipsElsewhere(t *testing.T) {
	for _, tc := range []struct {
		ci                   string
		wantFailed, wantSkip bool
		wantCode             int
	}{{"true", true, false, 1}, {"", false, true, 0}, {"false", false, true, 0}} {
		t.Setenv("CI", tc.ci)
		r := &recorder{}
		Skip(r, "needs root")
		if r.failed != tc.wantFailed || r.skipped != tc.wantSkip {
			t.Errorf("CI=%q: failed %v skipped %v, want %v %v", tc.ci, r.failed, r.skipped, tc.wantFailed, tc.wantSkip)
		}
		if code := Main("needs root"); code != tc.wantCode {
			t.Errorf("CI=%q: Main returned %d, want %d", tc.ci, code, tc.wantCode)
		}
	}
}
