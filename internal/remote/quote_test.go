package remote

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// roundTrip has a real shell print each argument of line separated by NULs.
func roundTrip(t testing.TB, shell, line string) []string {
	t.Helper()
	out, err := exec.Command(shell, "-c", "printf '%s\\0' "+line).Output()
	if err != nil {
		t.Fatalf("%s -c %q: %v", shell, line, err)
	}
	parts := strings.Split(string(out), "\x00")
	return parts[:len(parts)-1]
}

func shells(t testing.TB) []string {
	var found []string
	for _, sh := range []string{"sh", "bash", "dash"} {
		if path, err := exec.LookPath(sh); err == nil {
			found = append(found, path)
		}
	}
	if len(found) == 0 {
		t.Fatal("no POSIX shell to check quoting against")
	}
	return found
}

var hostile = []string{
	"", "plain", "with space", "it's", `"double"`, "$(touch /tmp/berth-pwned)", "`id`", "a;b", "a&&b", "a|b",
	"new\nline", "tab\there", `back\slash`, "$HOME", "${HOME}", "*", "?", "~root", "-n", "--", "'", "''", `'\''`,
	"\x1b[31mred", "ünïcødé", "!!", "#comment", "a=b c", strings.Repeat("x", 300), strings.Repeat("'$(", 100),
}

func TestQuoteSurvivesRealShells(t *testing.T) {
	for _, sh := range shells(t) {
		line, err := Command(hostile...)
		if err != nil {
			t.Fatal(err)
		}
		got := roundTrip(t, sh, line)
		if len(got) != len(hostile) {
			t.Fatalf("%s split %d arguments into %d: %q", sh, len(hostile), len(got), got)
		}
		for i := range hostile {
			if got[i] != hostile[i] {
				t.Errorf("%s: argument %d came out as %q, want %q", sh, i, got[i], hostile[i])
			}
		}
	}
}

func TestNULIsRefused(t *testing.T) {
	if _, err := Command("ok", "bad\x00byte"); !errors.Is(err, ErrNUL) {
		t.Fatalf("want ErrNUL, got %v", err)
	}
}

func TestScriptPassesArgumentsAsData(t *testing.T) {
	line, err := Script(`printf '%s|' "$@"`, "$(id)", "a b", "it's")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", line).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "$(id)|a b|it's|" {
		t.Fatalf("script saw %q", out)
	}
}

func TestScriptViaAnotherCommandPassesArgumentsAsData(t *testing.T) {
	script := `printf '%s|' "$0" "$@"`
	for range 2 { // the second time from the quoted script kept
		line, err := ScriptVia([]string{"env", "LC_ALL=C"}, script, hostile...)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("sh", "-c", line).Output()
		if err != nil {
			t.Fatal(err)
		}
		if want := "berth|" + strings.Join(hostile, "|") + "|"; string(out) != want {
			t.Fatalf("script saw %q, want %q", out, want)
		}
	}
	if _, err := ScriptVia([]string{"env"}, script, "a\x00b"); err == nil {
		t.Fatal("an argument with a NUL was taken")
	}
}

// FuzzQuote: whatever the argument, a real shell hands it to the program unchanged.
func FuzzQuote(f *testing.F) {
	for _, h := range hostile {
		f.Add(h)
	}
	sh := shells(f)[0]
	f.Fuzz(func(t *testing.T, s string) {
		line, err := Command("first", s, "last")
		if strings.IndexByte(s, 0) >= 0 {
			if !errors.Is(err, ErrNUL) {
				t.Fatalf("NUL accepted: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		got := roundTrip(t, sh, line)
		if len(got) != 3 || got[0] != "first" || got[1] != s || got[2] != "last" {
			t.Fatalf("%q came out as %q", s, got)
		}
	})
}
