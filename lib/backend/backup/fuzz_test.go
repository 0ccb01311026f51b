package backup

import (
	"bytes"
	"testing"
)

// FuzzVerify feeds arbitrary files to the backup reader (postern restore
// reads files from anywhere): it must return an error or a count, never
// panic or accept a backup without its trailer. Seeds in
// testdata/fuzz/FuzzVerify: a complete backup, a truncated one, and bad
// headers.
func FuzzVerify(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		h, n, err := Verify(bytes.NewReader(data))
		if err != nil {
			return
		}
		if h.Format != Format || n < 0 {
			t.Fatalf("accepted %q with header %+v", data, h)
		}
	})
}
