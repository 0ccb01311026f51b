package recording

import (
	"bytes"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// BenchmarkWriter: the writer alone (asciicast encoding, gzip, the hash
// chain, the chunk files with their fsync) on terminal-like output in
// 32 KiB reads, as a pty copy delivers it. ns/op over SetBytes is the
// CPU and disk cost per recorded MB on one core.
func BenchmarkWriter(b *testing.B) {
	line := []byte("\x1b[32m  CC\x1b[0m      lib/recording/writer.o -O2 -Wall -fstack-protector-strong [ok]\r\n")
	read := bytes.Repeat(line, (32<<10)/len(line))
	w, err := New(Config{
		Header:   Header{SessionID: testSession, Width: 200, Height: 50},
		Sink:     &DirSink{Storage: DirStorage{Dir: b.TempDir()}, Session: testSession},
		Clock:    clockwork.NewFakeClock(),
		MaxBytes: 1 << 40,
	})
	require.NoError(b, err)
	b.SetBytes(int64(len(read)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.Output(read)
	}
	_, err = w.Close("exit-status 0")
	b.StopTimer()
	require.NoError(b, err)
}
