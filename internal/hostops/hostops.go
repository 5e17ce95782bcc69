// Package hostops is what berth does on a build host over SSH: give a task its own throwaway
// user with a fresh key (Provision), remove it again (Clean), and check the host's health and
// sweep users whose tasks are gone (Update).
package hostops

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"regexp"
	"strings"

	"golang.org/x/crypto/ssh"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/remote"
)

// LegacyUserName is the build user earlier berth releases made for a TaskRun: "u-" and 12 hex
// digits of a hash of namespace and name. Kept to clean up after them.
func LegacyUserName(namespace, taskRun string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + taskRun))
	return "u-" + hex.EncodeToString(sum[:6])
}

var userNameRE = regexp.MustCompile(`^u-([0-9a-f]{12}|[0-9a-f]{24}-[0-9]{1,4})$`)

// Limits bound what one build may take of a shared host.
type Limits struct {
	Processes  int // hard nproc
	CPUMinutes int // hard cpu, per process
}

// DefaultLimits leave room for a parallel build and stop a runaway one.
var DefaultLimits = Limits{Processes: 4096, CPUMinutes: 6 * 60}

// ProvisionRequest is what the provision TaskRun's params and workspace say.
type ProvisionRequest struct {
	// Target logs in as the host's admin user (USER, HOST, the ssh workspace's key).
	Target remote.Target
	// AdminKeyPEM is the admin key itself; on platforms without per-task users it is the
	// pre-made build user's key and is what the task gets.
	AdminKeyPEM  []byte
	Namespace    string // NAMESPACE of the user TaskRun
	TaskRun      string // TASKRUN_NAME
	SudoCommands string // SUDO_COMMANDS, a comma list
	Platform     string // RAW_PLATFORM
	Limits       Limits
}

// Provisioned is what the task's secret carries.
type Provisioned struct {
	User          string
	Address       string
	UserDir       string
	PrivateKeyPEM []byte
}

// Host is the secret's host value, user@address.
func (p *Provisioned) Host() string { return p.User + "@" + p.Address }

// ValidateTaskRunRef checks a TaskRun's namespace and name the way the apiserver does, so a
// forged param is rejected before it goes anywhere near a host.
func ValidateTaskRunRef(namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("NAMESPACE %q is not a namespace name: %s", truncate(namespace), strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("TASKRUN_NAME %q is not a TaskRun name: %s", truncate(name), strings.Join(errs, "; "))
	}
	return nil
}

// usesPremadeUser tells platforms whose OS berth cannot create users on the Linux way. Their
// hosts are configured with an unprivileged build user (host.<name>.user or the VM image's
// user), and each task gets that user, a directory of its own, and its key.
func usesPremadeUser(platform string) bool {
	osName, _, _ := strings.Cut(platform, "/")
	return osName == "windows" || osName == "darwin"
}

// Provision creates the TaskRun's build user on the host (or refreshes it on a retry) with a
// key generated here: the private key never touches the host's disk.
func Provision(ctx context.Context, req ProvisionRequest) (*Provisioned, error) {
	if err := ValidateTaskRunRef(req.Namespace, req.TaskRun); err != nil {
		return nil, err
	}
	sudo, err := config.ParseSudoCommands(req.SudoCommands)
	if err != nil {
		return nil, fmt.Errorf("SUDO_COMMANDS: %w", err)
	}
	user := LegacyUserName(req.Namespace, req.TaskRun)
	if usesPremadeUser(req.Platform) {
		return &Provisioned{User: req.Target.User, Address: req.Target.Address,
			UserDir: "berth-builds/" + user, PrivateKeyPEM: req.AdminKeyPEM}, nil
	}
	limits := req.Limits
	if limits == (Limits{}) {
		limits = DefaultLimits
	}
	private, authorized, err := newKey(user + "@berth")
	if err != nil {
		return nil, err
	}
	client, err := remote.Dial(ctx, req.Target)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	line, err := asRoot(req.Target, provisionScript, user, fmt.Sprint(limits.Processes), fmt.Sprint(limits.CPUMinutes),
		strings.Join(sudo, ", "), req.Namespace+"/"+req.TaskRun)
	if err != nil {
		return nil, err
	}
	out, err := client.Run(ctx, "provisioning user "+user, line, authorized)
	if err != nil {
		return nil, err
	}
	home := strings.TrimSpace(string(out))
	if !strings.HasPrefix(home, "/") {
		return nil, fmt.Errorf("on host %s, provisioning user %s printed no home directory: %q", req.Target.Address, user, home)
	}
	return &Provisioned{User: user, Address: req.Target.Address, UserDir: home + "/build", PrivateKeyPEM: private}, nil
}

// Clean removes a build user with its processes, home, sudo rule and limits. A user that is
// already gone is success, so a repeated clean is harmless.
func Clean(ctx context.Context, target remote.Target, user string) error {
	if !userNameRE.MatchString(user) {
		return fmt.Errorf("%q is not a berth build user name; refusing to remove it", truncate(user))
	}
	client, err := remote.Dial(ctx, target)
	if err != nil {
		return err
	}
	defer client.Close()
	return clean(ctx, client, target, user)
}

func clean(ctx context.Context, client *remote.Client, target remote.Target, user string) error {
	line, err := asRoot(target, cleanScript, user)
	if err != nil {
		return err
	}
	_, err = client.Run(ctx, "removing user "+user, line, nil)
	return err
}

// asRoot builds the command line running script as root: directly for root, through
// passwordless sudo for another admin user.
func asRoot(target remote.Target, script string, args ...string) (string, error) {
	if target.User == "root" {
		return remote.Script(script, args...)
	}
	return remote.Command(append([]string{"sudo", "-n", "sh", "-c", script, "berth"}, args...)...)
}

// newKey makes an ed25519 key pair: the OpenSSH private key and the authorized_keys line.
func newKey(comment string) (private, authorized []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, nil, err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(block), ssh.MarshalAuthorizedKey(sshPub), nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}
