// Package remote runs commands on hosts over SSH (golang.org/x/crypto/ssh): it verifies each
// host's key against a pinned one or the one recorded when berth first met the host, bounds
// every dial by time, and builds every remote command line through one quoting function.
package remote

import (
	"errors"
	"strings"
)

// ErrNUL: a NUL byte cannot travel in a command line; such input is refused, not mangled.
var ErrNUL = errors.New("argument contains a NUL byte")

// Quote returns s as one word for a POSIX shell (sh, bash, dash, ksh, zsh): unchanged when it
// holds only characters no shell treats specially, otherwise in single quotes, inside which
// nothing is special but the quote itself, written as '\”.
func Quote(s string) (string, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return "", ErrNUL
	}
	if s == "" {
		return "''", nil
	}
	if strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-") == "" {
		return s, nil
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'", nil
}

// Command joins argv into a command line in which every argument, whatever it holds, reaches
// the program as exactly itself.
func Command(argv ...string) (string, error) {
	words := make([]string, len(argv))
	for i, a := range argv {
		q, err := Quote(a)
		if err != nil {
			return "", err
		}
		words[i] = q
	}
	return strings.Join(words, " "), nil
}

// Script returns the command line that runs a fixed shell script with args as its positional
// parameters ($1, $2, ...). The script is berth's own text; everything that comes from a
// TaskRun or a config travels in args and is never spliced into shell source.
func Script(script string, args ...string) (string, error) {
	return Command(append([]string{"sh", "-c", script, "berth"}, args...)...)
}
