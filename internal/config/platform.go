package config

import (
	"fmt"
	"regexp"
	"strings"
)

// Platform names what a task must build on: "os/arch" ("linux/s390x", "linux-mlarge/amd64"),
// or one of the names that mean "this cluster": local, localhost.
type Platform string

var rfc1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ParsePlatform checks a platform name. Each half of os/arch is an RFC 1035 label: lowercase
// letters, digits and '-', starting with a letter, at most 63 characters. linux/x86_64 is
// accepted as well because existing configs and tasks use it.
func ParsePlatform(s string) (Platform, error) {
	switch s {
	case "local", "localhost", "linux/x86_64":
		return Platform(s), nil
	}
	osName, arch, ok := strings.Cut(s, "/")
	if !ok || strings.Contains(arch, "/") {
		return "", fmt.Errorf("platform %q must be os/arch, like linux/arm64", s)
	}
	for _, part := range []string{osName, arch} {
		if !rfc1035Label.MatchString(part) {
			return "", fmt.Errorf("platform %q: %q is not a valid name part (lowercase letters, digits and '-', starting with a letter, at most 63 characters)", s, part)
		}
	}
	return Platform(s), nil
}

// Label is the platform as it appears in config keys and label values: '/' becomes '-'.
func (p Platform) Label() string { return strings.ReplaceAll(string(p), "/", "-") }

// OS is the operating system the platform's hosts run: the part before '/' up to its first
// '-', as sized variants name it ("linux-large/s390x" → "linux", "windows-4xlarge/amd64" →
// "windows"); macOS is "darwin", whether the platform says darwin or, as production names
// its EC2 Mac platforms, macos ("macos-mac2metal/arm64").
func (p Platform) OS() string {
	osName, _, _ := strings.Cut(string(p), "/")
	osName, _, _ = strings.Cut(osName, "-")
	if osName == "macos" {
		return "darwin"
	}
	return osName
}
