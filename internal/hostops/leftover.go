package hostops

import (
	"errors"
	"fmt"
	"strings"

	"github.com/berth-ci/berth/internal/remote"
)

// LeftoverError: the clean could not remove what one build user left (a process that would
// not die, a path that would not go). It judges the user, not the host: the host answered, and
// its admin login and the clean itself worked.
type LeftoverError struct{ Host, User, What string }

func (e *LeftoverError) Error() string {
	return fmt.Sprintf("on host %s, build user %s left what the clean could not remove: %s", e.Host, e.User, e.What)
}

// exitLeftover is cleanScript's exit status when something of the user remains; its stderr
// then has one "leftover: ..." line per kind of thing.
const exitLeftover = 18

// leftover turns the clean script's exit 18 into a *LeftoverError; other errors pass as they
// are (host trouble).
func leftover(t remote.Target, user string, err error) error {
	var remoteErr *remote.RemoteError
	if !errors.As(err, &remoteErr) || remoteErr.ExitCode != exitLeftover {
		return err
	}
	return &LeftoverError{Host: t.Address, User: user, What: leftoverWhat(remoteErr.Stderr)}
}

// leftoverWhat joins the "leftover:" lines of a clean's stderr.
func leftoverWhat(stderr string) string {
	var what []string
	for line := range strings.Lines(stderr) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "leftover:"); ok {
			what = append(what, strings.TrimSpace(rest))
		}
	}
	if len(what) == 0 {
		return "unknown (the clean reported leftovers without naming them: " + truncate(strings.TrimSpace(stderr)) + ")"
	}
	return strings.Join(what, "; ")
}
