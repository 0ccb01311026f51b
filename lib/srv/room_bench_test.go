package srv

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/srv/party"
	"github.com/postern-dev/postern/lib/srv/srvtest"
)

// BenchmarkSessionObservers: the owner's throughput on a busy pty
// session (`cat /dev/zero`) with 0 and 20 observers. "local" observers
// subscribe to the room in-process and drain it (the fan-out's own cost
// on the output path); "ssh" observers join over SSH like psh join (add
// the encryption of 20 more streams, on the same CPUs). Compare the MB/s
// of each against observers=0.
func BenchmarkSessionObservers(b *testing.B) {
	for _, bc := range []struct {
		n   int
		ssh bool
	}{{0, false}, {20, false}, {20, true}} {
		name := fmt.Sprintf("observers=%d", bc.n)
		if bc.n > 0 {
			name += map[bool]string{false: "/local", true: "/ssh"}[bc.ssh]
		}
		b.Run(name, func(b *testing.B) { benchObservers(b, bc.n, bc.ssh) })
	}
}

func benchObservers(b *testing.B, observers int, overSSH bool) {
	e := benchEnv(b)
	e.ap.UpsertRole(&services.Role{Kind: services.KindRole, Metadata: services.Metadata{Name: "auditor"}, Spec: services.RoleSpec{
		JoinSessions: []services.SessionJoinRule{{Roles: []string{"access"}, Modes: []string{"observer"}}},
	}})
	c, err := ssh.Dial("tcp", e.addr, aesFirst(e.clientConfig(e.me, e.signer(e.me))))
	require.NoError(b, err)
	defer c.Close()
	s, err := c.NewSession()
	require.NoError(b, err)
	defer s.Close()
	out, err := s.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, s.RequestPty("xterm", 40, 120, ssh.TerminalModes{}))
	require.NoError(b, s.Start("exec cat /dev/zero"))
	_, err = io.CopyN(io.Discard, out, benchChunk)
	require.NoError(b, err)
	rooms := e.srv.parties.List()
	require.Len(b, rooms, 1)
	room := rooms[0]

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := 0; i < observers; i++ {
		if !overSSH {
			sub, err := room.Out.Subscribe()
			require.NoError(b, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer sub.Close()
				for {
					if _, err := sub.Next(ctx); err != nil {
						return
					}
				}
			}()
			continue
		}
		signer := e.userCA.UserSigner(b, srvtest.UserCert{User: fmt.Sprint("obs", i), Logins: []string{e.me}, Roles: []string{"access", "auditor"}, Cluster: testCluster, Now: e.clock.Now()})
		oc, err := ssh.Dial("tcp", e.addr, aesFirst(e.clientConfig(e.me, signer)))
		require.NoError(b, err)
		os, err := oc.NewSession()
		require.NoError(b, err)
		oout, err := os.StdoutPipe()
		require.NoError(b, err)
		require.NoError(b, os.RequestPty("xterm", 40, 120, ssh.TerminalModes{}))
		require.NoError(b, os.RequestSubsystem(party.JoinSubsystem(room.ID, party.Observer)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			go func() {
				<-ctx.Done()
				oc.Close()
			}()
			_, _ = io.Copy(io.Discard, oout)
		}()
	}
	require.Eventually(b, func() bool { return room.Count(party.Observer) == observers || !overSSH }, 30*time.Second, time.Millisecond)
	b.SetBytes(benchChunk)
	b.ResetTimer()
	n, err := io.CopyN(io.Discard, out, int64(b.N)*benchChunk)
	b.StopTimer()
	if err != nil {
		for _, en := range e.logs.AllEntries() {
			b.Log(en.Message, en.Data)
		}
	}
	require.NoError(b, err)
	require.EqualValues(b, int64(b.N)*benchChunk, n)
}
