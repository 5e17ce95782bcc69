package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

var dnsUnsafe = regexp.MustCompile(`[^a-z0-9-]`)

// BuildHostName is the name of a host's BuildHost record: its name when that is a DNS label, else a
// readable prefix and a hash.
func BuildHostName(host string) string {
	lower := strings.ToLower(host)
	if lower == host && !dnsUnsafe.MatchString(host) && len(host) <= 63 && host != "" && host[0] != '-' && host[len(host)-1] != '-' {
		return host
	}
	sum := sha256.Sum256([]byte(host))
	prefix := strings.Trim(dnsUnsafe.ReplaceAllString(lower, "-"), "-")
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	return strings.TrimPrefix(prefix+"-"+hex.EncodeToString(sum[:6]), "-")
}
