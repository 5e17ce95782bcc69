package hostops

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/remote"
)

// UserName is the build user of one attempt at a TaskRun: "u-", 24 hex digits of the TaskRun's
// UID, "-" and the attempt. No two TaskRuns (a re-created one included) and no two attempts
// share a user.
func UserName(uid string, attempt int) string {
	hexUID := strings.ToLower(strings.ReplaceAll(uid, "-", ""))
	if len(hexUID) < 24 || strings.Trim(hexUID, "0123456789abcdef") != "" {
		sum := sha256.Sum256([]byte(uid))
		hexUID = hex.EncodeToString(sum[:])
	}
	return fmt.Sprintf("u-%s-%d", hexUID[:24], attempt)
}

// ErrUserExists says the user to be created exists already: berth never repairs a user.
var ErrUserExists = errors.New("the build user exists already")

// exitUserExists is provisionScript's exit status for ErrUserExists.
const exitUserExists = 17

// NewUser is a build user to create.
type NewUser struct {
	// Name must be a UserName, and must not exist on the host.
	Name string
	// AuthorizedKey is the task's public key, one authorized_keys line: the only key the
	// user will have.
	AuthorizedKey []byte
	// Owner is recorded beside the user ("namespace/name uid"), for the host's sweeps and
	// for people.
	Owner string
	// SudoCommands are the commands the user may run as root, each checked by berth's
	// grammar here and by visudo on the host.
	SudoCommands []string
	// Limits bound the user's processes and, where systemd runs, its slice;
	// config.DefaultBuildLimits when zero.
	Limits config.BuildLimits
	// UIDs is the range the user's UID (and on Linux its subordinate IDs) comes from, on
	// Linux and macOS; config.DefaultUIDRange when zero.
	UIDs config.UIDRange
}

func (u NewUser) check() (authorized []byte, err error) {
	if !newUserNameRE.MatchString(u.Name) {
		return nil, fmt.Errorf("%q is not a berth build user name", truncate(u.Name))
	}
	return u.checkInputs()
}

// checkInputs checks what every OS's script receives besides the name: one public key, an
// owner of one printable line, sudo commands of berth's grammar.
func (u NewUser) checkInputs() (authorized []byte, err error) {
	key, _, _, rest, err := ssh.ParseAuthorizedKey(u.AuthorizedKey)
	if err != nil || strings.TrimSpace(string(rest)) != "" {
		return nil, fmt.Errorf("the key for build user %s is not exactly one public key (authorized_keys line)", u.Name)
	}
	for _, r := range u.Owner {
		if unicode.IsControl(r) {
			return nil, fmt.Errorf("the owner of build user %s has a control character", u.Name)
		}
	}
	if len(u.SudoCommands) > 0 {
		if _, err := config.ParseSudoCommands(strings.Join(u.SudoCommands, ",")); err != nil {
			return nil, err
		}
	}
	return ssh.MarshalAuthorizedKey(key), nil
}

// uidRange is the range u's UID comes from.
func (u NewUser) uidRange() (config.UIDRange, error) {
	uids := u.UIDs
	if uids == (config.UIDRange{}) {
		uids = config.DefaultUIDRange
	}
	if uids.Users() == 0 {
		return uids, fmt.Errorf("the build UID range %s holds no build user", uids)
	}
	return uids, nil
}

// CreateUser creates u on the host and returns its build directory. It only ever creates: a
// user (or home) of that name already there is ErrUserExists, and nothing is changed.
func CreateUser(ctx context.Context, t remote.Target, u NewUser) (string, error) {
	authorized, err := u.check()
	if err != nil {
		return "", err
	}
	uids, err := u.uidRange()
	if err != nil {
		return "", err
	}
	limitsConf, sliceProps := u.limits()
	return createAsRoot(ctx, t, u.Name, authorized, provisionScript, u.Name, limitsConf, sliceProps,
		strings.Join(u.SudoCommands, ", "), u.Owner, fmt.Sprint(uids.First), fmt.Sprint(uids.Users()))
}

// limits renders u's limits for provisionScript: the lines of its limits.d file, and the
// properties of its slice, one a line, where CPUQUOTA stands for the percentage of the host's
// CPUs the script turns into systemd's CPUQuota= (which counts 100% per CPU). Every value was
// checked by config.ParseBuildLimits, so none holds a space or a newline.
func (u NewUser) limits() (limitsConf, sliceProps string) {
	l := u.Limits
	if l == (config.BuildLimits{}) {
		l = config.DefaultBuildLimits
	}
	var conf strings.Builder
	pair := func(item string, p config.LimitPair) {
		for _, v := range []struct {
			kind string
			n    int64
		}{{"soft", p.Soft}, {"hard", p.Hard}} {
			switch v.n {
			case 0: // not set: the host's own limit stays
			case config.Unlimited:
				fmt.Fprintf(&conf, "%s %s %s unlimited\n", u.Name, v.kind, item)
			default:
				fmt.Fprintf(&conf, "%s %s %s %d\n", u.Name, v.kind, item, v.n)
			}
		}
	}
	pair("nproc", l.Processes)
	pair("cpu", l.CPUMinutes)
	pair("nofile", l.OpenFiles)
	var props []string
	if l.MemoryMax != "" {
		props = append(props, "MemoryMax="+l.MemoryMax)
	}
	if l.CPUQuotaPercent != 0 {
		props = append(props, fmt.Sprintf("CPUQuota=%d", l.CPUQuotaPercent))
	}
	if l.CPUWeight != 0 {
		props = append(props, fmt.Sprintf("CPUWeight=%d", l.CPUWeight))
	}
	if l.TasksMax != "" {
		props = append(props, "TasksMax="+l.TasksMax)
	}
	return conf.String(), strings.Join(props, "\n")
}

// createAsRoot runs a create script as root with the key on stdin; the script prints the new
// user's home, or exits 17 when the user exists already.
func createAsRoot(ctx context.Context, t remote.Target, user string, authorized []byte, script string, args ...string) (string, error) {
	line, err := asRoot(t, script, args...)
	if err != nil {
		return "", err
	}
	out, err := run(ctx, t, "creating build user "+user, line, authorized)
	if err != nil {
		return "", userExists(t, user, err)
	}
	return buildDir(t, user, out)
}

// run dials and runs one command line.
func run(ctx context.Context, t remote.Target, what, line string, stdin []byte) ([]byte, error) {
	client, err := remote.Dial(ctx, t)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	return client.Run(ctx, what, line, stdin)
}

// userExists maps the scripts' exit status 17 to ErrUserExists.
func userExists(t remote.Target, user string, err error) error {
	var remoteErr *remote.RemoteError
	if errors.As(err, &remoteErr) && remoteErr.ExitCode == exitUserExists {
		return fmt.Errorf("on host %s, %s: %w", t.Address, user, ErrUserExists)
	}
	return err
}

// buildDir is the build directory of a user whose creation printed its home.
func buildDir(t remote.Target, user string, out []byte) (string, error) {
	home := strings.TrimSpace(string(out))
	if !strings.HasPrefix(home, "/") {
		return "", fmt.Errorf("on host %s, creating build user %s printed no home directory: %q", t.Address, user, truncate(home))
	}
	return home + "/build", nil
}
