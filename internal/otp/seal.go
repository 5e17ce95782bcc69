package otp

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
)

// ErrOpen says a sealed key does not open under the token with what is said about it: another
// token, or the sealed key or its context was changed.
var ErrOpen = errors.New("the sealed key does not open with this token")

// Seal encrypts key under the token with AES-256-GCM (a random nonce, prepended; a token seals
// one key, so its sealing key never meets a second nonce anyway).
// context is authenticated with it: what is kept beside the key (its binding to a task, its
// expiry) cannot be changed without the token either.
func (t Token) Seal(key, context []byte) []byte {
	aead := t.aead()
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(key)+aead.Overhead())
	_, _ = rand.Read(nonce) // never fails: see NewToken
	return aead.Seal(nonce, nonce, key, context)
}

// Open decrypts what Seal made with the same token and context.
func (t Token) Open(sealed, context []byte) ([]byte, error) {
	aead := t.aead()
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, ErrOpen
	}
	key, err := aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], context)
	if err != nil {
		return nil, ErrOpen
	}
	return key, nil
}

func (t Token) aead() cipher.AEAD {
	block, err := aes.NewCipher(t.derive(sealInfo, 32))
	if err != nil {
		panic(err) // a 32-byte key is always a valid AES key
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err) // AES has GCM's block size
	}
	return aead
}
