// Package backup writes and reads Postern backups: a snapshot of every item
// of a backend, in a format that does not depend on the backend, so that a
// backup of an etcd prefix restores into a SQLite data dir and back.
//
// A backup is a gzip stream of JSON lines:
//
//	{"format":"postern-backup","format_version":1,"schema_version":1,...}  the Header
//	{"key":"/users/alice","value":"BASE64","expires":"RFC 3339"}          one line per item
//	{"end":{"items":N}}                                                   the trailer
//
// The trailer is what tells a complete backup from a cut one: a stream
// that breaks midway (the auth server stopped, the network went) still ends
// in valid gzip if the writer closed it, but never with the right trailer.
// Readers refuse a backup without it. Item revisions are not kept: they
// are the source backend's and mean nothing to another.
//
// A backup holds the certificate authorities' private keys: whoever writes
// one to disk gives it mode 0600 (see WriteFile).
package backup

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/backend"
	"github.com/postern-dev/postern/lib/backend/schema"
	"github.com/postern-dev/postern/lib/version"
)

// Format names the file format in every header.
const Format = "postern-backup"

// FormatVersion is the version of the file format this code writes and
// the newest it reads. It is apart from the schema version: the format is
// the envelope, the schema what the items mean.
const FormatVersion = 1

// Header is the first line of a backup.
type Header struct {
	Format        string `json:"format"`
	FormatVersion int    `json:"format_version"`
	// SchemaVersion is the source backend's schema version (lib/backend/
	// schema): a restore refuses a backup newer than its own Postern.
	SchemaVersion int `json:"schema_version"`
	// Postern is the version of the auth server that wrote the backup.
	Postern string `json:"postern"`
	// ClusterName is the cluster the CAs belong to; a restored data dir
	// is pinned to it.
	ClusterName string `json:"cluster_name"`
	// Backend is the source backend's type (sqlite, etcd): information only.
	Backend string `json:"backend,omitempty"`
	// Created is when the snapshot was read.
	Created time.Time `json:"created"`
}

// line is one JSON line: an item, or the trailer.
type line struct {
	Key     string     `json:"key,omitempty"`
	Value   []byte     `json:"value,omitempty"`
	Expires *time.Time `json:"expires,omitempty"`
	End     *trailer   `json:"end,omitempty"`
}

type trailer struct {
	Items int `json:"items"`
}

// Write writes a backup of b to w: a consistent snapshot (see
// backend.Snapshotter) with h's ClusterName and Backend. It returns the
// number of items written. On error what was written is not a backup (no
// trailer) and must be discarded.
func Write(ctx context.Context, w io.Writer, b backend.Backend, h Header) (int, error) {
	rec, _, err := schema.Read(ctx, b)
	if err != nil {
		return 0, trace.Wrap(err)
	}
	h.Format, h.FormatVersion, h.SchemaVersion, h.Postern = Format, FormatVersion, rec.Version, version.Version
	if h.Created.IsZero() {
		h.Created = b.Clock().Now().UTC()
	}
	zw := gzip.NewWriter(w)
	bw := bufio.NewWriterSize(zw, 64<<10)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(h); err != nil {
		return 0, trace.Wrap(err)
	}
	n := 0
	err = backend.Snapshot(ctx, b, func(it backend.Item) error {
		l := line{Key: it.Key, Value: it.Value}
		if !it.Expires.IsZero() {
			exp := it.Expires.UTC()
			l.Expires = &exp
		}
		n++
		return trace.Wrap(enc.Encode(l))
	})
	if err != nil {
		return 0, trace.Wrap(err, "reading the backend for a backup")
	}
	if err := enc.Encode(line{End: &trailer{Items: n}}); err != nil {
		return 0, trace.Wrap(err)
	}
	if err := bw.Flush(); err != nil {
		return 0, trace.Wrap(err)
	}
	return n, trace.Wrap(zw.Close())
}

// Reader reads a backup item by item.
type Reader struct {
	// Header is the backup's first line, checked by NewReader.
	Header Header
	dec    *json.Decoder
	zr     *gzip.Reader
	n      int
	done   bool
}

// NewReader reads and checks the header of the backup in r. A backup of a
// newer format or schema than this Postern's is refused, both versions
// named.
func NewReader(r io.Reader) (*Reader, error) {
	zr, err := gzip.NewReader(bufio.NewReader(r))
	if err != nil {
		return nil, trace.BadParameter("not a Postern backup (not gzip): %v", err)
	}
	dec := json.NewDecoder(zr)
	var h Header
	if err := dec.Decode(&h); err != nil {
		return nil, trace.BadParameter("not a Postern backup (no header): %v", err)
	}
	if h.Format != Format {
		return nil, trace.BadParameter("not a Postern backup (format %q, want %q)", h.Format, Format)
	}
	if h.FormatVersion > FormatVersion || h.FormatVersion < 1 {
		return nil, trace.BadParameter("the backup's format version is %d, this Postern (%s) reads versions 1 to %d: restore it with the Postern that wrote it (%s)",
			h.FormatVersion, version.Version, FormatVersion, h.Postern)
	}
	if err := schema.CheckVersion(h.SchemaVersion, schema.Version); err != nil {
		return nil, trace.BadParameter("backup written by Postern %s: %v", h.Postern, err)
	}
	return &Reader{Header: h, dec: dec, zr: zr}, nil
}

// Next returns the next item; io.EOF once the trailer has been read and
// matched. A backup that ends early, or whose trailer does not match what
// was read, is an error: it is not complete.
func (r *Reader) Next() (backend.Item, error) {
	if r.done {
		return backend.Item{}, io.EOF
	}
	var l line
	if err := r.dec.Decode(&l); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return backend.Item{}, trace.BadParameter("the backup is incomplete: it ends after %d items without its trailer", r.n)
		}
		return backend.Item{}, trace.BadParameter("the backup is damaged after %d items: %v", r.n, err)
	}
	if l.End != nil {
		if l.End.Items != r.n {
			return backend.Item{}, trace.BadParameter("the backup is damaged: its trailer counts %d items, it holds %d", l.End.Items, r.n)
		}
		// Reading to the end checks the gzip checksum, and that nothing
		// follows the trailer.
		if err := r.dec.Decode(&l); err != io.EOF {
			return backend.Item{}, trace.BadParameter("the backup is damaged: data after its trailer (%v)", err)
		}
		r.done = true
		return backend.Item{}, io.EOF
	}
	it := backend.Item{Key: l.Key, Value: l.Value}
	if l.Expires != nil {
		it.Expires = *l.Expires
	}
	if it.Value == nil {
		it.Value = []byte{}
	}
	if err := backend.CheckItem(it); err != nil {
		return backend.Item{}, trace.BadParameter("the backup is damaged: item %d: %v", r.n+1, err)
	}
	r.n++
	return it, nil
}

// Verify reads a whole backup and returns its header and item count: a
// backup is only kept once it verifies.
func Verify(rd io.Reader) (Header, int, error) {
	r, err := NewReader(rd)
	if err != nil {
		return Header{}, 0, trace.Wrap(err)
	}
	n := 0
	for {
		_, err := r.Next()
		if err == io.EOF {
			return r.Header, n, nil
		}
		if err != nil {
			return Header{}, 0, trace.Wrap(err)
		}
		n++
	}
}
