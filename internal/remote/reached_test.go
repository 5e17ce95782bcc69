package remote

import (
	"errors"
	"fmt"
	"testing"
)

// A login the host refused ran nothing there, as an unreachable host did: a provisioning that
// failed so owes the host no clean (which would keep a slot until it succeeded). An error of
// a command that ran is not such a failure.
func TestNeverReached(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&UnreachableError{Host: "h", Err: errors.New("i/o timeout")}, true},
		{fmt.Errorf("creating build user: %w", &LoginError{Host: "h", User: "root", Err: errors.New("unable to authenticate")}), true},
		{&RemoteError{ExitCode: 1}, false},
		{errors.New("session closed mid-command"), false},
	} {
		if got := NeverReached(c.err); got != c.want {
			t.Errorf("NeverReached(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
