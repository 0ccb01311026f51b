package web

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gravitational/trace"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/utils"
)

// JoinRelayPath is where a host that can reach only the proxy joins:
// `GET /v1/join-relay` with `Upgrade: postern-join-relay` turns the HTTPS
// connection into a raw byte pipe to the auth API, over which the host
// runs its own TLS to auth (checked against its --ca-pin) and POSTs
// /v1/join.
//
// Why a raw relay and not a proxy that forwards the POST: the CA pin is
// the only thing that authenticates the auth server to a host with no
// certificate yet, and the token is a secret. If the proxy terminated the
// join, the pin would check the proxy's web certificate (self-signed,
// unpinned) and the token would be readable by anything holding the web
// port. Relayed, the pin checks auth end to end and the proxy sees only
// ciphertext. What the relay exposes is auth's join endpoint, where joins
// are rate limited per client address: the proxy opens the auth side as
// itself (lib/auth/joinrelay.go) and names the client, so one client's
// failed joins lock out that client, not every host behind this proxy.
const JoinRelayPath = "/v1/join-relay"

// JoinRelayProtocol is the Upgrade token of the join relay.
const JoinRelayProtocol = "postern-join-relay"

// joinRelayIdle bounds a relayed join: a join is one request.
const joinRelayIdle = 30 * time.Second

// joinRelay owns the relayed connections: http.Server.Shutdown does not
// wait for hijacked ones, so they are tracked here.
type joinRelay struct {
	dial func(ctx context.Context, clientAddr string) (net.Conn, error)
	ctx  context.Context
	stop context.CancelFunc
	// mu guards closed, so that no splice is added once shutdown waits.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func newJoinRelay(dial func(ctx context.Context, clientAddr string) (net.Conn, error)) *joinRelay {
	// The relay owns the spliced connections past the requests that hijacked them; Shutdown ends them.
	ctx, stop := context.WithCancel(context.Background())
	return &joinRelay{dial: dial, ctx: ctx, stop: stop}
}

func (j *joinRelay) shutdown(ctx context.Context) error {
	if j == nil {
		return nil
	}
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.stop()
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return trace.Wrap(ctx.Err())
	}
}

func (s *Server) serveJoinRelay(w http.ResponseWriter, r *http.Request) {
	j := s.joinRelay
	if j == nil {
		writeError(w, http.StatusNotImplemented, "this proxy relays no joins")
		return
	}
	if r.Header.Get("Upgrade") != JoinRelayProtocol {
		writeError(w, http.StatusBadRequest, "the join relay needs the header Upgrade: "+JoinRelayProtocol)
		return
	}
	dctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	ac, err := j.dial(dctx, r.RemoteAddr)
	cancel()
	if err != nil {
		s.cfg.Logger.WithError(err).Warn("Join relay: cannot reach the auth API.")
		writeError(w, http.StatusBadGateway, "the proxy cannot reach the auth server")
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		ac.Close()
		writeError(w, http.StatusBadRequest, "the join relay needs HTTP/1.1")
		return
	}
	nc, rw, err := hj.Hijack()
	if err != nil {
		ac.Close()
		return
	}
	_, err = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + JoinRelayProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	if err == nil {
		err = rw.Flush()
	}
	if err != nil || rw.Reader.Buffered() > 0 {
		// The host speaks only after the 101: buffered bytes would be
		// lost, so such a client is refused.
		nc.Close()
		ac.Close()
		return
	}
	_ = nc.SetDeadline(time.Now().Add(joinRelayIdle))
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		nc.Close()
		ac.Close()
		return
	}
	j.wg.Add(1)
	j.mu.Unlock()
	go func() {
		defer j.wg.Done()
		_, _, _ = utils.Splice(j.ctx, nc, ac)
	}()
}

// DialJoinRelay opens the join relay on the proxy's web address: the
// returned conn is a raw pipe to the auth API, to run the pinned join TLS
// over (auth.JoinParams.Dial). The outer TLS is not verified on purpose:
// it is only a carrier through the proxy's HTTPS port, and the pin inside
// is what authenticates auth.
func DialJoinRelay(ctx context.Context, proxyWebAddr string) (net.Conn, error) {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}}
	nc, err := d.DialContext(ctx, "tcp", proxyWebAddr)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "dialing the proxy's web port %s: %v", proxyWebAddr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	req := "GET " + JoinRelayPath + " HTTP/1.1\r\nHost: " + proxyWebAddr + "\r\nUpgrade: " + JoinRelayProtocol + "\r\nConnection: Upgrade\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		nc.Close()
		return nil, trace.ConnectionProblem(err, "join relay at %s: %v", proxyWebAddr, err)
	}
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		nc.Close()
		return nil, trace.ConnectionProblem(err, "join relay at %s: %v", proxyWebAddr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		nc.Close()
		return nil, trace.ConnectionProblem(nil, "the proxy at %s refused to relay the join: %s", proxyWebAddr, resp.Status)
	}
	if br.Buffered() > 0 {
		nc.Close()
		return nil, trace.ConnectionProblem(nil, "join relay at %s: unexpected bytes after the upgrade", proxyWebAddr)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

// PingProxy reads GET /webapi/ping from a proxy's web address without
// verifying its certificate: a host that has not joined has nothing to
// verify it with, and what it learns here (the tunnel address) is checked
// later by the proxy's host certificate.
func PingProxy(ctx context.Context, proxyWebAddr string) (*webapi.PingResponse, error) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+proxyWebAddr+"/webapi/ping", nil)
	if err != nil {
		return nil, trace.Wrap(err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "pinging the proxy at %s: %v", proxyWebAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, trace.ConnectionProblem(nil, "pinging the proxy at %s: %s", proxyWebAddr, resp.Status)
	}
	var pr webapi.PingResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&pr); err != nil {
		return nil, trace.ConnectionProblem(err, "pinging the proxy at %s: %v", proxyWebAddr, err)
	}
	return &pr, nil
}
