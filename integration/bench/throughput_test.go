package bench

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// transferSize is what each benchmark op moves: big enough that the
// session's start is noise next to it, small enough for `make bench`.
const transferSize = 64 << 20

var zeros = make([]byte, 32<<10)

// writeZeros writes n zero bytes in channel-packet-sized writes.
func writeZeros(w io.Writer, n int64) error {
	for n > 0 {
		chunk := int64(len(zeros))
		if n < chunk {
			chunk = n
		}
		if _, err := w.Write(zeros[:chunk]); err != nil {
			return err
		}
		n -= chunk
	}
	return nil
}

// BenchmarkSessionThroughput moves 64 MiB per op through a session channel
// on the node (stdin into the command, and the command's stdout), directly
// and through the proxy, for each of cipherSets. One command per
// sub-benchmark serves every op, answering on stdout, so that neither the
// login shell's start-up nor data still in flight (2 MiB of channel window
// and the pipes) is counted.
func BenchmarkSessionThroughput(b *testing.B) {
	c := getCluster(b)
	for _, p := range paths {
		for _, cs := range cipherSets {
			for _, dir := range []string{"upload", "download"} {
				b.Run(fmt.Sprintf("%s/%s/%s", p.name, cs.name, dir), func(b *testing.B) {
					h, err := dialNode(c.creds(), p.proxy(c), c.node, cs.ciphers)
					if err != nil {
						b.Fatal(err)
					}
					defer h.Close()
					// upload: each op writes transferSize bytes and waits for
					// "k"; download: each op writes a line and reads
					// transferSize bytes.
					cmd := fmt.Sprintf(`echo r; while [ "$(head -c %d | wc -c)" = %d ]; do echo k; done`, transferSize, transferSize)
					if dir == "download" {
						cmd = fmt.Sprintf("echo r; while read x; do head -c %d /dev/zero; done", transferSize)
					}
					s, err := startSynced(h, cmd)
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					b.SetBytes(transferSize)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if dir == "upload" {
							err = s.upload()
						} else {
							err = s.download()
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
				})
			}
		}
	}
}

// syncedSession is a running command that printed "r\n" when it started.
type syncedSession struct {
	s   *ssh.Session
	in  io.WriteCloser
	out *bufio.Reader
}

func startSynced(h *hop, cmd string) (*syncedSession, error) {
	s, err := h.node.NewSession()
	if err != nil {
		return nil, err
	}
	in, err := s.StdinPipe()
	if err != nil {
		s.Close()
		return nil, err
	}
	out, err := s.StdoutPipe()
	if err != nil {
		s.Close()
		return nil, err
	}
	if err := s.Start(cmd); err != nil {
		s.Close()
		return nil, err
	}
	r := bufio.NewReaderSize(out, 64<<10)
	if line, err := r.ReadString('\n'); err != nil || line != "r\n" {
		s.Close()
		return nil, fmt.Errorf("waiting for the command to start: %q %v", line, err)
	}
	return &syncedSession{s: s, in: in, out: r}, nil
}

// Close ends the command (stdin EOF ends both loops) and the session.
func (s *syncedSession) Close() {
	s.in.Close()
	_ = s.s.Wait()
	s.s.Close()
}

func (s *syncedSession) upload() error {
	if err := writeZeros(s.in, transferSize); err != nil {
		return err
	}
	if line, err := s.out.ReadString('\n'); err != nil || line != "k\n" {
		return fmt.Errorf("upload not acknowledged: %q %v", line, err)
	}
	return nil
}

func (s *syncedSession) download() error {
	if _, err := s.in.Write([]byte("\n")); err != nil {
		return err
	}
	n, err := io.CopyN(io.Discard, s.out, transferSize)
	if err != nil {
		return fmt.Errorf("downloaded %d of %d bytes: %v", n, transferSize, err)
	}
	return nil
}

// sink is a TCP server that swallows a stream and answers its byte count
// at EOF: the far end of the -L forward.
type sink struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newSink(b *testing.B) *sink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := &sink{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer conn.Close()
				n, _ := io.Copy(io.Discard, conn)
				fmt.Fprintf(conn, "%d\n", n)
			}()
		}
	}()
	return s
}

func (s *sink) Close() {
	s.ln.Close()
	s.wg.Wait()
}

// BenchmarkForwardThroughput is `ssh -L`: a direct-tcpip channel on the
// node to a local TCP sink, 64 MiB per op, directly and through the proxy
// (through the proxy it is a channel inside a channel, as with ssh -J -L).
func BenchmarkForwardThroughput(b *testing.B) {
	c := getCluster(b)
	sk := newSink(b)
	defer sk.Close()
	for _, p := range paths {
		for _, cs := range cipherSets {
			b.Run(fmt.Sprintf("%s/%s", p.name, cs.name), func(b *testing.B) {
				h, err := dialNode(c.creds(), p.proxy(c), c.node, cs.ciphers)
				if err != nil {
					b.Fatal(err)
				}
				defer h.Close()
				b.SetBytes(transferSize)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := forwardOnce(h, sk.ln.Addr().String()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func forwardOnce(h *hop, addr string) error {
	conn, err := h.node.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Minute))
	if err := writeZeros(conn, transferSize); err != nil {
		return err
	}
	cw, ok := conn.(interface{ CloseWrite() error })
	if !ok {
		return fmt.Errorf("%T has no CloseWrite", conn)
	}
	if err := cw.CloseWrite(); err != nil {
		return err
	}
	var n int64
	if _, err := fmt.Fscan(conn, &n); err != nil {
		return fmt.Errorf("reading the sink's count: %v", err)
	}
	if n != transferSize {
		return fmt.Errorf("sink got %d bytes, want %d", n, transferSize)
	}
	return nil
}
