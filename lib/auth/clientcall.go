package auth

// How one call reaches an auth server: which server, how a failure is
// told apart (not sent, broken, the caller gave up), when it is sent
// again, and the fail-back probe (failover.go keeps the servers' state).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gravitational/trace"
	"github.com/sirupsen/logrus"

	"github.com/postern-dev/postern/lib/api/authapi"
)

// idempotentPuts are the PUTs that may be sent twice with the effect of
// once (they replace a record with the one in the request), so a call
// whose connection broke can be sent again to another auth server.
// Heartbeats are the ones that matter: a node whose heartbeats fail long
// enough drops out of the proxies' lists. POSTs (logins spend OTP codes,
// tokens and users are created), DELETEs (the second would say NotFound)
// and the other PUTs are sent once.
var idempotentPuts = map[string]bool{
	"/v1/nodes":      true,
	"/v1/proxies":    true,
	"/v1/roles":      true,
	"/v1/networking": true,
	// Replacing a connector with the same body twice is the same.
	"/v1/oidc_connectors": true,
}

// idempotent reports whether a call may be sent again after its
// connection broke with the call in flight.
func idempotent(method, path string) bool {
	switch method {
	case http.MethodGet, http.MethodHead:
		return true
	case http.MethodPut:
		return idempotentPuts[path]
	}
	return false
}

// attemptFailure says how a call to one server failed, when it did not
// get an answer.
type attemptFailure int

const (
	// gotAnswer: the server answered (success or an API error).
	gotAnswer attemptFailure = iota
	// notSent: connecting failed, or the server refused the call because
	// it is going away; the call did not run and can go anywhere else.
	notSent
	// broken: the call was sent but its connection broke or it timed
	// out; it may have run.
	broken
	// cancelled: the caller cancelled its context.
	cancelled
	// expired: the caller's own deadline passed with the call sent (or
	// the connection not made) and no answer: the server is as suspect as
	// after a broken call, but there is no time left to send it again.
	expired
)

// send makes one call, trying the auth servers as failover.go explains.
// newReq builds the request for a server's base URL; handle reads the
// answer (it owns resp.Body when keep is true; send closes it otherwise)
// and returns a broken error (isBrokenRead) when the connection broke
// while it read. timeout bounds each attempt (0: only ctx does; a handle
// that keeps the body needs 0, the stream outliving the attempt).
func (c *Client) send(ctx context.Context, method, path string, timeout time.Duration,
	newReq func(ctx context.Context, base string) (*http.Request, error),
	handle func(resp *http.Response) (keep bool, err error),
) error {
	c.maybeProbe()
	canRepeat := idempotent(method, path)
	repeated := false
	var dialErrs []string
	var lastErr error
	for _, idx := range c.servers.order() {
		attemptTimeout := timeout
		if deadline, ok := ctx.Deadline(); ok && canRepeat && !repeated && len(c.servers.addrs) > 1 {
			// Leave half of the caller's time for sending the call
			// again to the next server if this one froze.
			if half := time.Until(deadline) / 2; attemptTimeout == 0 || half < attemptTimeout {
				attemptTimeout = half
			}
		}
		failure, err := c.attempt(ctx, idx, attemptTimeout, newReq, handle)
		switch failure {
		case gotAnswer:
			c.servers.answered(idx)
			return err
		case cancelled:
			return trace.ConnectionProblem(err, "auth server at %s: %v", c.servers.addrs[idx], err)
		case expired:
			// A heartbeat's deadline (its interval) is shorter than the
			// call timeout: without this, each one would wait on the
			// frozen server's next pooled connection, and the node would
			// never leave it.
			c.servers.suspect(idx, err)
			c.transport.CloseIdleConnections()
			return trace.ConnectionProblem(err, "auth server at %s: %v", c.servers.addrs[idx], err)
		case notSent:
			c.servers.suspect(idx, err)
			var de *dialError
			if errors.As(err, &de) {
				dialErrs = append(dialErrs, de.Error())
			} else {
				dialErrs = append(dialErrs, c.servers.addrs[idx]+": "+err.Error())
			}
			lastErr = err
		case broken:
			c.servers.suspect(idx, err)
			// The pooled connections of the failed server would only
			// fail (or hang) the next calls too.
			c.transport.CloseIdleConnections()
			lastErr = err
			if !canRepeat || repeated {
				return trace.ConnectionProblem(err, "auth server at %s: %v", c.servers.addrs[idx], err)
			}
			repeated = true
			c.cfg.Logger.WithError(err).WithFields(logrus.Fields{"path": path, "failed": c.servers.addrs[idx]}).Info("Sending the call again to the next auth server.")
		}
	}
	if len(dialErrs) == 1 && len(c.servers.addrs) == 1 {
		return trace.ConnectionProblem(lastErr, "%s", dialErrs[0])
	}
	if repeated || len(dialErrs) < len(c.servers.addrs) {
		return trace.ConnectionProblem(lastErr, "auth server at %s: %v", c.cfg.Addr, lastErr)
	}
	return trace.ConnectionProblem(lastErr, "no auth server reachable: %s", strings.Join(dialErrs, "; "))
}

// attempt sends one call to server idx and classifies how it failed.
func (c *Client) attempt(ctx context.Context, idx int, timeout time.Duration,
	newReq func(ctx context.Context, base string) (*http.Request, error),
	handle func(resp *http.Response) (keep bool, err error),
) (attemptFailure, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		actx, cancel = context.WithTimeout(ctx, timeout)
	}
	keep := false
	defer func() {
		if !keep {
			cancel()
		}
	}()
	req, err := newReq(actx, "https://"+c.servers.addrs[idx])
	if err != nil {
		return gotAnswer, trace.Wrap(err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return callerEnded(ctx), err
		}
		var de *dialError
		if errors.As(err, &de) {
			return notSent, err
		}
		return broken, err
	}
	if resp.Header.Get(headerGoingAway) != "" {
		resp.Body.Close()
		return notSent, trace.ConnectionProblem(nil, "the auth server is shutting down")
	}
	keep, err = handle(resp)
	if !keep {
		resp.Body.Close()
	}
	if err != nil && isBrokenRead(err) {
		if ctx.Err() != nil {
			return callerEnded(ctx), err
		}
		return broken, err
	}
	return gotAnswer, err
}

// callerEnded classifies an attempt the caller's context ended.
func callerEnded(ctx context.Context) attemptFailure {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return expired
	}
	return cancelled
}

// brokenRead marks an error reading an answer whose connection broke.
type brokenRead struct{ err error }

func (e *brokenRead) Error() string { return e.err.Error() }
func (e *brokenRead) Unwrap() error { return e.err }

func isBrokenRead(err error) bool {
	var br *brokenRead
	return errors.As(err, &br)
}

// readBroken is wrapped, as brokenRead when cause (from reading an
// answer) is the connection's fault (a cut-off or timed-out body), not the
// data's.
func readBroken(cause, wrapped error) error {
	var ne net.Error
	if errors.Is(cause, io.ErrUnexpectedEOF) || errors.Is(cause, context.DeadlineExceeded) || errors.As(cause, &ne) {
		return &brokenRead{err: wrapped}
	}
	return wrapped
}

// maybeProbe starts a background probe of the preferred server when one
// is due (failover.go).
func (c *Client) maybeProbe() {
	if c.closeCtx.Err() != nil || !c.servers.startProbe() {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.servers.probeDone(c.probe())
	}()
}

// probe pings the preferred server once, bounded by the dial timeout (a
// connection that answers at all answers a ping at once).
func (c *Client) probe() error {
	ctx, cancel := context.WithTimeout(c.closeCtx, 2*c.cfg.DialTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.servers.addrs[0]+"/v1/ping", nil)
	if err != nil {
		return trace.Wrap(err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return trace.ConnectionProblem(err, "probing %s: %v", c.servers.addrs[0], err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, authapi.MaxErrorBody))
	if resp.Header.Get(headerGoingAway) != "" || resp.StatusCode == http.StatusServiceUnavailable {
		return trace.ConnectionProblem(nil, "probing %s: %s", c.servers.addrs[0], resp.Status)
	}
	return nil
}

// do sends one call: in (if not nil) as the JSON body, out (if not nil)
// decoded from the JSON answer, errors mapped back to trace kinds.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var data []byte
	if in != nil {
		var err error
		if data, err = json.Marshal(in); err != nil {
			return trace.Wrap(err)
		}
	}
	// Go's transport itself sends a request again on a fresh connection
	// when a kept-alive one turns out closed, if the request is
	// idempotent: GETs, and requests with this header.
	var idemKey string
	if method != http.MethodGet && idempotent(method, path) {
		idemKey = uuid.NewString()
	}
	pathQuery := path
	if len(query) > 0 {
		pathQuery += "?" + query.Encode()
	}
	newReq := func(ctx context.Context, base string) (*http.Request, error) {
		var body io.Reader
		if in != nil {
			body = bytes.NewReader(data)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+pathQuery, body)
		if err != nil {
			return nil, trace.Wrap(err)
		}
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if idemKey != "" {
			req.Header.Set("Idempotency-Key", idemKey)
		}
		return req, nil
	}
	handle := func(resp *http.Response) (bool, error) {
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return false, authapi.ReadErrorResponse(resp)
		}
		if out == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, authapi.MaxErrorBody))
			return false, nil
		}
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return false, readBroken(err, trace.ConnectionProblem(err, "auth server at %s: bad response: %v", resp.Request.URL.Host, err))
		}
		return false, nil
	}
	return trace.Wrap(c.send(ctx, method, path, c.cfg.Timeout, newReq, handle))
}
