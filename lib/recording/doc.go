// Package recording writes, stores and verifies session recordings.
//
// A recording is an asciicast v2 file (https://docs.asciinema.org/manual/asciicast/v2/)
// cut into chunks: the header line and the event lines, in order, split at
// line boundaries, each chunk gzip-compressed on its own. Concatenating the
// decompressed chunks gives the .cast file byte for byte, so standard tools
// (asciinema, asciinema-player) read an export unchanged.
//
// A chunk is closed when it holds DefaultChunkBytes of events or when
// DefaultFlushInterval has passed since its first event, whichever comes
// first: a node killed mid-session loses at most the last interval.
//
// Hash chain. Chunk i's hash is
//
//	h_0 = SHA-256(zero32 || gz_0)
//	h_i = SHA-256(h_{i-1} || gz_i)
//
// where gz_i are the compressed bytes exactly as stored and zero32 is 32
// zero bytes. The last chunk is marked final; its hash (the final hash) is
// carried by the session.end audit event, so rewriting the stored chunks
// and their hashes together is still caught against the audit log. Each
// stored chunk keeps its own hash, so Verify names the first wrong chunk:
// a flipped byte (hash mismatch), a deleted chunk (a gap in the indexes),
// a cut tail (no final chunk, or a final hash that is not the audited one).
package recording
