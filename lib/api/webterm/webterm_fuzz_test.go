package webterm

import (
	"bytes"
	"testing"
)

// FuzzDecodeFrame: every websocket message a browser sends goes through
// the frame decoder and, by type, the resize and params decoders. None may
// panic; whatever they accept must be in range, and a decoded frame must
// re-encode to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	f.Add([]byte("rhello"))
	f.Add([]byte(`w{"cols":80,"rows":24}`))
	f.Add([]byte(`w{"cols":80,"rows":24,"x":1}`))
	f.Add([]byte("p12345.5"))
	f.Add([]byte(`c{"code":0,"reason":"bye"}`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		fr, err := DecodeFrame(msg)
		if err != nil {
			if len(msg) != 0 && len(msg) <= MaxFrameSize {
				t.Fatalf("refused a valid frame: %v", err)
			}
			return
		}
		if !bytes.Equal(EncodeFrame(fr.Type, fr.Payload), msg) {
			t.Fatal("frame does not round-trip")
		}
		if size, err := DecodeResize(fr.Payload); err == nil {
			if size.Cols < 1 || size.Rows < 1 || size.Cols > MaxTermDimension || size.Rows > MaxTermDimension {
				t.Fatalf("accepted size %+v", size)
			}
		}
		if seq, data, err := DecodeSeq(fr.Payload); err == nil {
			if !bytes.Equal(EncodeSeqFrame(fr.Type, seq, data), msg) {
				t.Fatal("sequenced frame does not round-trip")
			}
		}
		if m, err := DecodeAuthMessage(fr.Payload); err == nil && m.Token == "" {
			t.Fatal("accepted a first message without a token")
		}
		if p, err := DecodeTerminalParams(string(fr.Payload)); err == nil {
			if p.Host == "" || p.Login == "" || p.Cols < 1 || p.Rows < 1 {
				t.Fatalf("accepted params %+v", p)
			}
		}
	})
}
