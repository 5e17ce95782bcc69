package ibmp

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"

	"github.com/berth-ci/berth/internal/cloud"
)

// Instance names. Power VS keeps no tags berth can list by, so the name carries the group
// (installation and platform) and the launch token. Power VS takes server names of at most
// 47 characters and makes them the VM's host name, so berth's use lowercase letters, digits
// and hyphens only:
//
//	b<group key>-<token>   where the token <uid>-<attempt> is written as <uid's 32 hex digits>-<attempt>
//	b<group key>-h<32 hex digits of the token's SHA-256>   for any other token
//
// The first form gives the token back (Instance.Token, which the sweeper uses to spare
// instances whose id berth has not saved yet); the second, which berth's own tokens never
// need, does not.
const maxNameLen = 47

var (
	uidToken  = regexp.MustCompile(`^([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})-([0-9]{1,4})$`)
	uidInName = regexp.MustCompile(`^b[0-9a-f]{8}-([0-9a-f]{8})([0-9a-f]{4})([0-9a-f]{4})([0-9a-f]{4})([0-9a-f]{12})-([0-9]{1,4})$`)
)

// groupPrefix starts the name of every instance of the installation and platform in tags.
func groupPrefix(tags map[string]string) string { return "b" + cloud.GroupKey(tags) + "-" }

// instanceName is the name of the instance that the launch with token makes.
func instanceName(tags map[string]string, token string) string {
	if m := uidToken.FindStringSubmatch(token); m != nil {
		return groupPrefix(tags) + m[1] + m[2] + m[3] + m[4] + m[5] + "-" + m[6]
	}
	sum := sha256.Sum256([]byte(token))
	return groupPrefix(tags) + "h" + hex.EncodeToString(sum[:16])
}

// tokenOf gives back the token an instance name was made from, or "" when the name does
// not say (hashed, or not berth's).
func tokenOf(name string) string {
	m := uidInName.FindStringSubmatch(name)
	if m == nil {
		return ""
	}
	return m[1] + "-" + m[2] + "-" + m[3] + "-" + m[4] + "-" + m[5] + "-" + m[6]
}
