package config

import (
	"fmt"
	"strings"
)

// KeyType is the algorithm of the key pair berth makes for every build user: the private half
// goes into the task's secret (under id_rsa, whatever the algorithm, as the contract names it),
// the public half onto the host. It is berth's own global key user-key-type. The default,
// ed25519, is the fastest to make and the smallest; clients in FIPS mode refuse it, so FIPS
// clusters choose ecdsa-p256 or rsa-3072.
type KeyType string

const (
	KeyTypeEd25519   KeyType = "ed25519"
	KeyTypeECDSAP256 KeyType = "ecdsa-p256"
	KeyTypeRSA3072   KeyType = "rsa-3072"
)

// DefaultKeyType is the key type of a config that does not set user-key-type.
const DefaultKeyType = KeyTypeEd25519

// KeyTypes are the accepted values of user-key-type, default first.
var KeyTypes = []KeyType{KeyTypeEd25519, KeyTypeECDSAP256, KeyTypeRSA3072}

// userKeyTypeKey is the global key that chooses the KeyType.
const userKeyTypeKey = "user-key-type"

// ParseKeyType reads a value of user-key-type. Case and surrounding spaces do not matter; an
// empty value is the default. A value it does not know is an error naming the accepted ones
// (and the likely one, for a typo).
func ParseKeyType(raw string) (KeyType, error) {
	value := strings.ToLower(strings.TrimSpace(raw))
	if value == "" {
		return DefaultKeyType, nil
	}
	accepted := make([]string, len(KeyTypes))
	for i, k := range KeyTypes {
		if value == string(k) {
			return k, nil
		}
		accepted[i] = string(k)
	}
	msg := fmt.Sprintf("%q is not a key type berth makes; write one of %s (clients in FIPS mode need ecdsa-p256 or rsa-3072)",
		strings.TrimSpace(raw), strings.Join(accepted, ", "))
	if s := suggestKeyType(value, accepted); s != "" {
		msg += "; did you mean " + s + "?"
	}
	return "", fmt.Errorf("%s", msg)
}

// suggestKeyType is the accepted value a mistyped one most likely meant: a near spelling, or
// the only one the value begins (the algorithm named without its size, "rsa").
func suggestKeyType(value string, accepted []string) string {
	if s := suggest(value, accepted); s != "" {
		return s
	}
	var prefixed []string
	for _, a := range accepted {
		if strings.HasPrefix(a, value+"-") {
			prefixed = append(prefixed, a)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	return ""
}

// parseUserKeyType sets the config's UserKeyType from user-key-type. A bad value is an error of
// that key alone: on a reload the last good type stays in force (see Merge), on a first start
// the default.
func (p *parser) parseUserKeyType() {
	p.cfg.UserKeyType = DefaultKeyType
	kt, err := ParseKeyType(p.data[userKeyTypeKey])
	if err != nil {
		p.globalErrorf(userKeyTypeKey, "%v", err)
		return
	}
	p.cfg.UserKeyType = kt
}
