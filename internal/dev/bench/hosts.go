package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
)

// Simulated hosts for a controller that provisions over SSH itself: each is an SSH endpoint on
// loopback that accepts the admin key and answers berth's host commands at once, as the
// simulated Tekton completes provision TaskRuns at once. The answers are those of a healthy
// Linux host with room to spare.

// addressing is how the config names the simulated hosts.
type addressing string

const bareIPs addressing = "bare IPs"

// startHosts starts n simulated hosts, each on port 22 of a loopback address of its own
// (127.B.x.y, B drawn so that runs at once, as tests make, use different ones), so that the
// config names each by a bare IP as the upstream controller requires. Where port 22 cannot be
// had (no root, or a server on port 22 of every address), the hosts listen on free ports of
// 127.0.0.1, and the addressing says why.
func startHosts(n int, handler sshfake.Handler) (*sshfake.Fleet, addressing, error) {
	var err error
	for range 8 {
		block := 64 + rand.IntN(190)
		addrs := make([]string, n)
		for i := range addrs {
			addrs[i] = net.JoinHostPort(fmt.Sprintf("127.%d.%d.%d", block, 1+i/250, 1+i%250), "22")
		}
		var fleet *sshfake.Fleet
		if fleet, err = sshfake.StartFleetAt(addrs, handler); err == nil {
			return fleet, bareIPs, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EADDRINUSE) {
		return nil, "", err
	}
	fleet, freeErr := sshfake.StartFleet(n, handler)
	if freeErr != nil {
		return nil, "", freeErr
	}
	return fleet, addressing("IP:port, since " + err.Error()), nil
}

// configAddress is how the config names a host listening on addr: its bare IP on port 22.
func configAddress(addr string) string {
	if host, port, err := net.SplitHostPort(addr); err == nil && port == "22" {
		return host
	}
	return addr
}

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
