package controller

import (
	"runtime"
	"testing"
)

func TestMaxProcsIsBerthsUnlessTheOperatorChose(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "")
	if !setMaxProcs(1) || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("--max-procs=1: %d processors, want 1", runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "3")
	if setMaxProcs(1) || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("with GOMAXPROCS=3 set: %d processors, want the operator's 3", runtime.GOMAXPROCS(0))
	}
	t.Setenv("GOMAXPROCS", "")
	if setMaxProcs(0) || runtime.GOMAXPROCS(0) != 3 {
		t.Fatalf("with --max-procs=0: %d processors, want the runtime's 3 left alone", runtime.GOMAXPROCS(0))
	}
}
