// Package srv is Postern's SSH server core: the node's SSH server (port
// 3022) and, through the ProxyHandler seam, the proxy's SSH front door.
//
// # The model
//
// One owner chain, each level closing and waiting for its children:
//
//	Server ── owns listeners and conns (map + WaitGroup)
//	  conn ── one SSH connection: global requests, channel dispatch,
//	          keep-alives, idle timeout, -R listeners, the agent socket
//	    session ── one `session` channel: its request loop, its process
//	               and the goroutines copying the process's stdio
//	    forward ── one direct-tcpip / forwarded-tcpip / agent channel:
//	               a utils.Splice
//
// Every goroutine a conn starts (sessions, forwards, keep-alive and idle
// loops, accept loops of -R and agent listeners) is counted in conn.wg;
// conn.close closes the SSH connection, which ends every channel and
// request stream, then cancels conn.ctx, which closes the listeners and
// stops the loops, and waits for conn.wg. The Server counts each conn's
// handler in Server.wg. When Close or Shutdown returns, nothing started by
// the package is still running.
//
// # Decisions
//
// Authentication and RBAC happen once, in the public key callback: the
// certificate must come from this cluster's user CA (fetched live through
// AccessPoint), be inside its validity window on Config.Clock, name the
// requested login among its principals and carry no critical option but
// source-address. In node mode the roles named in the certificate are
// then fetched live and must allow the login on this node (labels and
// logins); the result (authz.Identity with its AccessChecker, permits)
// travels in ssh.Permissions.ExtraData. Who a certificate names and what
// that identity may reach are lib/authz's, shared with the proxy and the
// web terminal; the permit-* decisions are pure functions in authz.go.
//
// What the server serves is one policy value (policy.go), decided in New
// from the mode: the channel types, global requests, session requests and
// subsystems it serves, each with its handler. Dispatch looks a name up
// there and refuses what is not listed, so a request type added to SSH
// tomorrow is refused on the proxy and on the node alike until someone
// gives it a handler (TestModePolicy walks the vocabulary).
//
// Locks (Config.Locks, locks.go) are checked at authentication and at
// every channel open, from memory; the Server's enforceLocks loop, owned by
// the Server and stopped by Close and Shutdown, ends the live conns a new
// lock covers.
//
// # Lock order
//
// Server.mu, then conn.mu, then session.mu; none is held while blocking on
// the network or on a process.
package srv
