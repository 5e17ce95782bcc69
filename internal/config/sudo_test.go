package config

import (
	"strings"
	"testing"
)

func TestSudoCommandsGrammar(t *testing.T) {
	for _, tc := range []struct{ list, want string }{
		{"/bin/ls, ALL", `"ALL" grants more than one command`},
		{"ALL", `"ALL" grants more than one command`},
		{"/usr/bin/*", "a wildcard or pattern"},
		{"/bin/", "would grant every command in the directory"},
		{"/bin/sh -c x:y", "sudoers syntax"},
		{"/usr/bin/env =", "sudoers syntax"},
		{"/usr/bin/env A=B /bin/sh", "sudoers syntax"},
		{"sudoedit /etc/x", `"sudoedit" grants more than one command`},
		{"/usr/bin/sudoedit", "grants more than one command"},
		{"/bin/cat /etc/shadow\n", "control character"},
		{"/bin/cat\t/etc/shadow", "control character"},
		{"(root) /bin/sh", "not an absolute path"},
		{"/bin/sh (root)", "sudoers syntax"},
		{"!/bin/sh", "not an absolute path"},
		{"/bin/ls !/bin/sh", "sudoers syntax"},
		{"/bin/echo #1", "sudoers syntax"},
		{`"/bin/sh"`, "not an absolute path"},
		{`/bin/echo "x"`, "a quote"},
		{"/bin/echo 'x'", "a quote"},
		{"/bin/ls ^a$", "a wildcard or pattern"},
		{"/bin/ls [ab]", "a wildcard or pattern"},
		{"/bin/ls a?", "a wildcard or pattern"},
		{`/bin/ls a\,b`, "sudoers syntax"},
		{"/usr/bin/../bin/sh", "'..' segment"},
		{"/usr//bin/sh", "empty"},
		{"podman", "not an absolute path"},
		{"/usr/bin/podman;rm", "not a plain character"},
		{"/usr/bin/podman, , /usr/bin/buildah", "empty item"},
		{"/usr/bin/pödman", "not a plain character"},
	} {
		_, err := ParseSudoCommands(tc.list)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error with %q", tc.list, err, tc.want)
		}
	}
	for list, want := range map[string]string{
		"/usr/bin/podman":                                                "/usr/bin/podman",
		"/usr/bin/systemctl restart foo.service":                         "/usr/bin/systemctl restart foo.service",
		"/usr/bin/podman, /usr/bin/buildah":                              "/usr/bin/podman|/usr/bin/buildah",
		"/usr/bin/podman, /usr/bin/rm /usr/share/containers/mounts.conf": "/usr/bin/podman|/usr/bin/rm /usr/share/containers/mounts.conf",
		"/usr/bin/chown -R builder@example:1000 /x":                      "",
	} {
		got, err := ParseSudoCommands(list)
		if want == "" {
			if err == nil {
				t.Errorf("%q was accepted", list)
			}
			continue
		}
		if err != nil || strings.Join(got, "|") != want {
			t.Errorf("%q: got %q, %v; want %q", list, got, err, want)
		}
	}
}

// FuzzSudoCommands: whatever the grammar accepts carries none of what widens a sudoers rule.
func FuzzSudoCommands(f *testing.F) {
	for _, seed := range []string{"/usr/bin/podman", "/bin/ls, ALL", "/usr/bin/*", "/bin/sh -c x:y", "/a b, /c d"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, list string) {
		cmds, err := ParseSudoCommands(list)
		if err != nil {
			return
		}
		for _, cmd := range cmds {
			if strings.ContainsAny(cmd, ",:=()!\\#*?[]^$'\"`\n\r\t") {
				t.Fatalf("accepted %q with a sudoers metacharacter", cmd)
			}
			for _, w := range strings.Fields(cmd) {
				if w == "ALL" || strings.HasSuffix(w, "sudoedit") && (w == "sudoedit" || strings.HasSuffix(w, "/sudoedit")) {
					t.Fatalf("accepted %q", cmd)
				}
			}
			if !strings.HasPrefix(cmd, "/") || strings.HasSuffix(strings.Fields(cmd)[0], "/") {
				t.Fatalf("accepted %q: not an absolute path to a file", cmd)
			}
		}
	})
}
