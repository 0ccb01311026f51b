package utils

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"

	"github.com/gravitational/trace"
	"golang.org/x/crypto/ssh"
)

// GenerateKeyPair makes an ed25519 key for SSH: priv is an OpenSSH PEM
// private key, pub the public key in authorized_keys format (with a
// trailing newline, as ssh.MarshalAuthorizedKey writes it). It lives here,
// not in lib/auth, because clients (psh's login) make their keys too and
// must not link the auth server to do it.
func GenerateKeyPair() (priv []byte, pub []byte, err error) {
	pubKey, privKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	block, err := ssh.MarshalPrivateKey(privKey, "")
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	sshPub, err := ssh.NewPublicKey(pubKey)
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	return pem.EncodeToMemory(block), ssh.MarshalAuthorizedKey(sshPub), nil
}
