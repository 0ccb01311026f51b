package health

import (
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
)

// sshServer is a real x/crypto SSH server on loopback presenting a given
// host key: what an OpenSSH node looks like up to user authentication,
// which it refuses to everyone.
type sshServer struct {
	addr   string
	signer ssh.Signer

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func startSSHServer(t *testing.T, signer ssh.Signer) *sshServer {
	t.Helper()
	s := &sshServer{signer: signer, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(s.stop)
	return s
}

func (s *sshServer) serve(ln net.Listener) {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	cfg := &ssh.ServerConfig{
		PasswordCallback: func(ssh.ConnMetadata, []byte) (*ssh.Permissions, error) {
			return nil, errors.New("no")
		},
	}
	cfg.AddHostKey(s.signer)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = true
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
					c.Close()
				}()
				// The health check hangs up after the host key: this
				// fails, as it must.
				if sc, chans, reqs, err := ssh.NewServerConn(c, cfg); err == nil {
					go ssh.DiscardRequests(reqs)
					for ch := range chans {
						ch.Reject(ssh.Prohibited, "test")
					}
					sc.Close()
				}
			}()
		}
	}()
}

// stop closes the listener and every connection, and waits for them.
func (s *sshServer) stop() {
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
		s.ln = nil
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// restart listens again on the same address.
func (s *sshServer) restart(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", s.addr)
	require.NoError(t, err)
	s.serve(ln)
}
