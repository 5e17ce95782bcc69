package config

import (
	"fmt"
	"path"
	"strings"
	"unicode"
)

// The sudo-commands grammar. A sudoers rule grants what its text says in sudoers' own
// language, and that language is rich: commas, colons and equals signs start new specs or
// options, parentheses change the runas user, '!' negates, a trailing '/' grants a whole
// directory, '*' and '^...$' match many commands, "ALL" is everything and "sudoedit" edits any
// file. So berth accepts only a small language whose meaning it knows:
//
//	list    = item { "," item }           spaces around commas are ignored
//	item    = path { " " arg }
//	path    = "/" segment { "/" segment } no "." or ".." segment, no trailing "/"
//	segment = 1*( letter | digit | "_" | "." | "-" | "+" )
//	arg     = 1*( letter | digit | "_" | "." | "-" | "+" | "/" | "@" | "%" | "~" )
//
// and neither "ALL" nor "sudoedit" anywhere. visudo checks the rule again on the host.

func isSegmentChar(r rune) bool {
	return r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) || strings.ContainsRune("_.-+", r)
}

func isArgChar(r rune) bool { return isSegmentChar(r) || strings.ContainsRune("/@%~", r) }

// whyRefused names what a character would do in a sudoers rule.
func whyRefused(r rune) string {
	switch {
	case strings.ContainsRune(",:=()!\\#", r):
		return "sudoers syntax"
	case strings.ContainsRune("*?[]^$", r):
		return "a wildcard or pattern"
	case strings.ContainsRune("'\"`", r):
		return "a quote"
	case unicode.IsControl(r):
		return "a control character"
	}
	return "not a plain character"
}

// ParseSudoCommands splits a comma list of sudo commands and checks each against the grammar
// above; provisioning checks the list again, whatever the config said.
func ParseSudoCommands(list string) ([]string, error) {
	for _, r := range list {
		if unicode.IsControl(r) {
			return nil, fmt.Errorf("sudo-commands %q has a control character (%U): list commands on one line, separated by commas", list, r)
		}
	}
	var cmds []string
	for _, raw := range strings.Split(list, ",") {
		item := strings.Trim(raw, " ")
		if item == "" {
			return nil, fmt.Errorf("sudo-commands %q has an empty item: separate commands with single commas", list)
		}
		if err := checkSudoCommand(item); err != nil {
			return nil, fmt.Errorf("sudo command %q is not allowed: %w; each command must be an absolute path to a file, followed by plain arguments separated by spaces", item, err)
		}
		cmds = append(cmds, strings.Join(strings.Fields(item), " "))
	}
	return cmds, nil
}

func checkSudoCommand(item string) error {
	words := strings.Fields(item)
	for _, w := range words {
		if w == "ALL" || w == "sudoedit" || path.Base(w) == "sudoedit" {
			return fmt.Errorf("%q grants more than one command", w)
		}
	}
	cmd := words[0]
	if !strings.HasPrefix(cmd, "/") {
		return fmt.Errorf("%q is not an absolute path", cmd)
	}
	if strings.HasSuffix(cmd, "/") {
		return fmt.Errorf("%q ends in '/', which would grant every command in the directory", cmd)
	}
	for _, seg := range strings.Split(cmd[1:], "/") {
		switch seg {
		case "", ".", "..":
			return fmt.Errorf("%q is not a plain path (empty, '.' or '..' segment)", cmd)
		}
		for _, r := range seg {
			if !isSegmentChar(r) {
				return fmt.Errorf("%q in %q is %s", r, cmd, whyRefused(r))
			}
		}
	}
	for _, arg := range words[1:] {
		for _, r := range arg {
			if !isArgChar(r) {
				return fmt.Errorf("%q in argument %q is %s", r, arg, whyRefused(r))
			}
		}
	}
	return nil
}
