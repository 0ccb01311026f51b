package web

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"testing"

	"github.com/go-webauthn/webauthn/protocol/webauthncbor"
	"github.com/go-webauthn/webauthn/protocol/webauthncose"
	"github.com/stretchr/testify/require"
)

// softKey is a software authenticator for tests: a P-256 key that answers
// navigator.credentials.create and .get the way a browser and a security
// key together do (attestation "none"), with every field the test may
// want to falsify (origin, RP id, counter) in its hands.
type softKey struct {
	priv       *ecdsa.PrivateKey
	credID     []byte
	userHandle []byte
	// count is the signature counter the next assertion carries (it is
	// incremented before each one).
	count uint32
}

var b64 = base64.RawURLEncoding

func newSoftKey(t *testing.T) *softKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	id := make([]byte, 32)
	_, err = rand.Read(id)
	require.NoError(t, err)
	return &softKey{priv: priv, credID: id}
}

// creationOptions is what the tests read of navigator.credentials.create's
// argument.
type creationOptions struct {
	PublicKey struct {
		Challenge string `json:"challenge"`
		RP        struct {
			ID string `json:"id"`
		} `json:"rp"`
		User struct {
			ID string `json:"id"`
		} `json:"user"`
	} `json:"publicKey"`
}

// requestOptions is what the tests read of navigator.credentials.get's.
type requestOptions struct {
	PublicKey struct {
		Challenge string `json:"challenge"`
		RPID      string `json:"rpId"`
	} `json:"publicKey"`
}

func clientData(t *testing.T, typ, challenge, origin string) []byte {
	t.Helper()
	cd, err := json.Marshal(map[string]any{"type": typ, "challenge": challenge, "origin": origin, "crossOrigin": false})
	require.NoError(t, err)
	return cd
}

// authData builds authenticator data (WebAuthn section 6.1): the RP id
// hash, flags UP and UV (and AT with attested credential data), the
// counter.
func (k *softKey) authData(t *testing.T, rpID string, attested bool) []byte {
	t.Helper()
	h := sha256.Sum256([]byte(rpID))
	out := append([]byte{}, h[:]...)
	flags := byte(0x01 | 0x04)
	if attested {
		flags |= 0x40
	}
	out = append(out, flags)
	out = binary.BigEndian.AppendUint32(out, k.count)
	if attested {
		out = append(out, make([]byte, 16)...) // AAGUID: zero under "none"
		out = binary.BigEndian.AppendUint16(out, uint16(len(k.credID)))
		out = append(out, k.credID...)
		pub, err := webauthncbor.Marshal(webauthncose.EC2PublicKeyData{
			PublicKeyData: webauthncose.PublicKeyData{KeyType: int64(webauthncose.EllipticKey), Algorithm: int64(webauthncose.AlgES256)},
			Curve:         1, // P-256
			XCoord:        k.priv.X.FillBytes(make([]byte, 32)),
			YCoord:        k.priv.Y.FillBytes(make([]byte, 32)),
		})
		require.NoError(t, err)
		out = append(out, pub...)
	}
	return out
}

// create answers creation options from origin, claiming rpID.
func (k *softKey) create(t *testing.T, options []byte, origin, rpID string) []byte {
	t.Helper()
	var opts creationOptions
	require.NoError(t, json.Unmarshal(options, &opts))
	if rpID == "" {
		rpID = opts.PublicKey.RP.ID
	}
	uh, err := b64.DecodeString(opts.PublicKey.User.ID)
	require.NoError(t, err)
	k.userHandle = uh
	att, err := webauthncbor.Marshal(map[string]any{"fmt": "none", "attStmt": map[string]any{}, "authData": k.authData(t, rpID, true)})
	require.NoError(t, err)
	out, err := json.Marshal(map[string]any{
		"id": b64.EncodeToString(k.credID), "rawId": b64.EncodeToString(k.credID), "type": "public-key",
		"response": map[string]any{
			"clientDataJSON":    b64.EncodeToString(clientData(t, "webauthn.create", opts.PublicKey.Challenge, origin)),
			"attestationObject": b64.EncodeToString(att),
		},
	})
	require.NoError(t, err)
	return out
}

// get answers request options from origin, claiming rpID (the options'
// when empty), with the next counter value.
func (k *softKey) get(t *testing.T, options []byte, origin, rpID string) []byte {
	t.Helper()
	var opts requestOptions
	require.NoError(t, json.Unmarshal(options, &opts))
	if rpID == "" {
		rpID = opts.PublicKey.RPID
	}
	k.count++
	ad := k.authData(t, rpID, false)
	cd := clientData(t, "webauthn.get", opts.PublicKey.Challenge, origin)
	cdHash := sha256.Sum256(cd)
	digest := sha256.Sum256(append(append([]byte{}, ad...), cdHash[:]...))
	sig, err := ecdsa.SignASN1(rand.Reader, k.priv, digest[:])
	require.NoError(t, err)
	out, err := json.Marshal(map[string]any{
		"id": b64.EncodeToString(k.credID), "rawId": b64.EncodeToString(k.credID), "type": "public-key",
		"response": map[string]any{
			"clientDataJSON":    b64.EncodeToString(cd),
			"authenticatorData": b64.EncodeToString(ad),
			"signature":         b64.EncodeToString(sig),
			"userHandle":        b64.EncodeToString(k.userHandle),
		},
	})
	require.NoError(t, err)
	return out
}
