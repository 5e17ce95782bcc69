// Package otp is the cryptography of the one-time key hand-over: the token a task gets in
// place of its private key, the name under which the key is kept, and the sealing of the key
// under the token. Plain Go: where the sealed key is kept is package keyserver's affair.
//
// The token is the only thing the task sends (the real buildah-remote step POSTs it and
// nothing else), so everything hangs on it: the key's place is derived from it, and so is the
// key that seals it. Whoever can read where keys are kept learns neither a token nor a key.
package otp

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
)

// tokenBytes is the token's randomness: 256 bits, far past guessing, and past a birthday
// collision of every token an installation will ever issue.
const tokenBytes = 32

// TokenLength is the length of a token's text: unpadded URL-safe base64 of tokenBytes, so it
// travels in a curl -d body and a URL without escaping.
var TokenLength = base64.RawURLEncoding.EncodedLen(tokenBytes)

// Token is a one-time token: the only thing a task holds of its key until it redeems it.
type Token struct{ raw [tokenBytes]byte }

// ErrMalformed says a text is not a token of this shape.
var ErrMalformed = errors.New("not a one-time token")

// NewToken draws a token from the operating system's random source.
func NewToken() Token {
	var t Token
	// crypto/rand.Read never fails on the platforms Go supports; it crashes the program rather
	// than return predictable bytes.
	_, _ = rand.Read(t.raw[:])
	return t
}

// String is the token's text, as the task's secret carries it.
func (t Token) String() string { return base64.RawURLEncoding.EncodeToString(t.raw[:]) }

// ParseToken reads a token as a task sends it. Surrounding white space is dropped: a file
// written with a trailing newline is sent as is by some clients.
func ParseToken(text string) (Token, error) {
	text = strings.TrimSpace(text)
	var t Token
	if len(text) != TokenLength {
		return t, ErrMalformed
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(text)
	if err != nil || len(raw) != tokenBytes {
		return t, ErrMalformed
	}
	copy(t.raw[:], raw)
	return t, nil
}

// Domain separation of what is derived from a token: the name and the sealing key never
// coincide, and neither is the token.
const (
	nameInfo = "berth.dev one-time key: name v1"
	sealInfo = "berth.dev one-time key: AES-256-GCM v1"
)

// Name is where the token's key is kept: a Secret of that name finds the key without listing,
// and tells nothing of the token (a one-way derivation of 128 bits).
func (t Token) Name() string {
	return "berth-otp-" + hex.EncodeToString(t.derive(nameInfo, 16))
}

func (t Token) derive(info string, n int) []byte {
	// The token is uniformly random already: HKDF only separates what is derived from it.
	out, err := hkdf.Key(sha256.New, t.raw[:], nil, info, n)
	if err != nil {
		panic(err) // only for lengths past 255 hash blocks, which are constants here
	}
	return out
}
