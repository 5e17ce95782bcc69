package hostops

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/berth-ci/berth/internal/remote"
)

// existingUsersScript prints, of the user names on standard input (one a line), those the
// host knows. Reading passwd needs no privilege, so it runs as the admin login itself.
const existingUsersScript = `while IFS= read -r name; do
	if id -u "$name" >/dev/null 2>&1; then printf '%s\n' "$name"; fi
done
exit 0`

// ExistingUsers tells which of names are users on a Linux or macOS host, in one SSH session
// whatever their number: the names go on standard input, never on a command line. Only build
// user names (UpstreamUserName, LegacyUserName, UserName) may be asked about; an answer naming
// anything not asked is an error, so a host's output can never add a user to the answer.
func ExistingUsers(ctx context.Context, t remote.Target, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	var stdin bytes.Buffer
	for _, n := range names {
		if !userNameRE.MatchString(n) {
			return nil, fmt.Errorf("%q is not a berth build user name; refusing to ask host %s about it", truncate(n), t.Address)
		}
		stdin.WriteString(n + "\n")
	}
	line, err := remote.Script(existingUsersScript)
	if err != nil {
		return nil, err
	}
	out, err := run(ctx, t, "listing build users", line, stdin.Bytes())
	if err != nil {
		return nil, fmt.Errorf("which build users exist: %w", err)
	}
	var found []string
	for _, l := range strings.Fields(string(out)) {
		if !slices.Contains(names, l) {
			return nil, fmt.Errorf("on host %s, which build users exist: the host answered %q, which was not asked", t.Address, truncate(l))
		}
		found = append(found, l)
	}
	return found, nil
}
