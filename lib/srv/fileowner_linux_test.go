package srv

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func fileOwner(t *testing.T, path string) uint32 {
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Uid
}

func ed25519GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}
