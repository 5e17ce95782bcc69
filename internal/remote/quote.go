// Package remote runs commands on hosts over SSH (golang.org/x/crypto/ssh): it verifies each
// host's key against a pinned one or the one recorded when berth first met the host, bounds
// every dial by time, and builds every remote command line through one quoting function.
package remote

import (
	"errors"
	"strings"
	"sync"
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
	words, err := appendQuoted(make([]string, 0, len(argv)), argv)
	if err != nil {
		return "", err
	}
	return strings.Join(words, " "), nil
}

// appendQuoted appends each of argv to words as one shell word (Quote).
func appendQuoted(words, argv []string) ([]string, error) {
	for _, a := range argv {
		q, err := Quote(a)
		if err != nil {
			return nil, err
		}
		words = append(words, q)
	}
	return words, nil
}

// Script returns the command line that runs a fixed shell script with args as its positional
// parameters ($1, $2, ...). The script is berth's own text; everything that comes from a
// TaskRun or a config travels in args and is never spliced into shell source.
func Script(script string, args ...string) (string, error) {
	return ScriptVia(nil, script, args...)
}

// ScriptVia is Script run through another command: via is its argv, before "sh -c" (sudo -n).
func ScriptVia(via []string, script string, args ...string) (string, error) {
	quotedScript, err := quoteScript(script)
	if err != nil {
		return "", err
	}
	words, err := appendQuoted(make([]string, 0, len(via)+4+len(args)), via)
	if err != nil {
		return "", err
	}
	if words, err = appendQuoted(append(words, "sh", "-c", quotedScript, "berth"), args); err != nil {
		return "", err
	}
	return strings.Join(words, " "), nil
}

// quotedScripts holds each script's quoted form (Quote). The scripts are berth's own few
// constants, run once or twice per task: quoting one afresh each time cost a copy of it, and
// more for every quote it holds. Nothing a tenant or a config writes is ever a key here.
var quotedScripts sync.Map

func quoteScript(script string) (string, error) {
	if q, ok := quotedScripts.Load(script); ok {
		return q.(string), nil
	}
	q, err := Quote(script)
	if err != nil {
		return "", err
	}
	quotedScripts.Store(script, q)
	return q, nil
}
