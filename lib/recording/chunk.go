package recording

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"sync"

	"github.com/gravitational/trace"
	kgzip "github.com/klauspost/compress/gzip"
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

// gzipWriters recycles compressors: a deflate compressor holds about a
// MiB of tables, and building one per 256 KiB chunk cost more than the
// compressing.
var gzipWriters = sync.Pool{New: func() any {
	zw, _ := kgzip.NewWriterLevel(nil, kgzip.BestSpeed)
	return zw
}}

// compress gzips a chunk with klauspost/compress at its fastest level:
// standard gzip (any reader, old Postern included, reads it), about three
// times faster than compress/gzip's BestSpeed, which matters because every
// recorded byte is compressed so (the writer's store feeds a
// chunkCompressor as it encodes; compress is the whole-chunk form).
func compress(b []byte) ([]byte, error) {
	c := newChunkCompressor()
	c.write(b)
	return c.close()
}

// chunkCompressor gzips one chunk in pieces, as the writer's store
// encodes it, with a compressor from the pool.
type chunkCompressor struct {
	zw  *kgzip.Writer
	buf *bytes.Buffer
	err error
}

func newChunkCompressor() *chunkCompressor {
	c := &chunkCompressor{zw: gzipWriters.Get().(*kgzip.Writer), buf: bytes.NewBuffer(make([]byte, 0, 16<<10))}
	c.zw.Reset(c.buf)
	return c
}

func (c *chunkCompressor) write(p []byte) {
	if c.err == nil {
		_, c.err = c.zw.Write(p)
	}
}

// close ends the gzip stream, returns the compressor to the pool and
// the chunk's compressed bytes.
func (c *chunkCompressor) close() ([]byte, error) {
	if c.err == nil {
		c.err = c.zw.Close()
	}
	gzipWriters.Put(c.zw)
	c.zw = nil
	if c.err != nil {
		return nil, trace.Wrap(c.err)
	}
	return c.buf.Bytes(), nil
}
