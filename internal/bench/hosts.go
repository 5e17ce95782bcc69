package bench

import (
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-ci/berth/internal/testground/sshfake"
)

// Simulated hosts for a controller that provisions over SSH itself: each is an SSH endpoint on
// loopback that accepts the admin key and answers berth's host commands at once, as the
// simulated Tekton completes provision TaskRuns at once. The answers are those of a healthy
// Linux host with room to spare.

var buildUserRE = regexp.MustCompile(`\bu-[0-9a-f]{12}(?:[0-9a-f]{12}-[0-9]{1,4})?\b`)

// hostAnswers counts what the simulated hosts were asked to do.
type hostAnswers struct{ provisions, cleans, checks atomic.Int64 }

func (h *hostAnswers) answer(cmd sshfake.Command) sshfake.Reply {
	switch {
	case strings.Contains(cmd.Line, "useradd"):
		user := buildUserRE.FindString(cmd.Line)
		if user == "" {
			return sshfake.Reply{Stderr: "no build user named in the command", Exit: 2}
		}
		h.provisions.Add(1)
		return sshfake.Reply{Stdout: "/home/" + user + "\n"}
	case strings.Contains(cmd.Line, "df -Pk"):
		h.checks.Add(1)
		return sshfake.Reply{Stdout: fmt.Sprintf("disk 104857600 94371840\nnow %d\n", time.Now().Unix())}
	case strings.Contains(cmd.Line, "userdel"):
		h.cleans.Add(1)
		return sshfake.Reply{}
	default:
		return sshfake.Reply{}
	}
}
