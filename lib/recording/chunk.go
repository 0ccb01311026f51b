package recording

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"

	"github.com/gravitational/trace"
)

// Chunk is one stored piece of a recording.
type Chunk struct {
	// Index counts from 0 with no gaps.
	Index int `json:"index"`
	// Hash is the chained hash (doc.go), hex.
	Hash string `json:"hash"`
	// Final marks the last chunk of a recording that ended properly.
	Final bool `json:"final,omitempty"`
	// Data is the gzip-compressed asciicast lines.
	Data []byte `json:"data"`
}

// ChainHash computes chunk hash h_i from h_{i-1} (hex, "" for the first
// chunk) and the compressed bytes.
func ChainHash(prevHex string, gz []byte) (string, error) {
	prev := make([]byte, sha256.Size)
	if prevHex != "" {
		b, err := hex.DecodeString(prevHex)
		if err != nil || len(b) != sha256.Size {
			return "", trace.BadParameter("previous chunk hash %q is not a hex SHA-256", prevHex)
		}
		prev = b
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(gz)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// MaxChunkDecoded bounds one decompressed chunk: a writer closes a chunk
// past DefaultChunkBytes, and one pty read of escaped output adds at most a
// few hundred KiB, so anything far larger is not ours (a gzip bomb).
const MaxChunkDecoded = 8 << 20

// DecodeChunk decompresses one chunk and checks that it is whole asciicast
// lines: each a JSON value, the stream ending with a newline.
func DecodeChunk(gz []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, trace.BadParameter("chunk is not gzip: %v", err)
	}
	defer zr.Close()
	out, err := io.ReadAll(io.LimitReader(zr, MaxChunkDecoded+1))
	if err != nil {
		return nil, trace.BadParameter("chunk does not decompress: %v", err)
	}
	if len(out) > MaxChunkDecoded {
		return nil, trace.BadParameter("chunk decompresses to more than %d bytes", MaxChunkDecoded)
	}
	if len(out) == 0 || out[len(out)-1] != '\n' {
		return nil, trace.BadParameter("chunk does not end with a whole line")
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), MaxChunkDecoded)
	line := 0
	for sc.Scan() {
		line++
		if !json.Valid(sc.Bytes()) {
			return nil, trace.BadParameter("chunk line %d is not JSON", line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, trace.BadParameter("chunk: %v", err)
	}
	return out, nil
}

func compress(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	if _, err := zw.Write(b); err != nil {
		return nil, trace.Wrap(err)
	}
	if err := zw.Close(); err != nil {
		return nil, trace.Wrap(err)
	}
	return buf.Bytes(), nil
}
