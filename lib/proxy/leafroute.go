package proxy

// Routing through the root (docs/leaf-clusters.md): the Router resolves
// the cluster first. The local cluster is routed here, with this proxy's
// inventory; a leaf cluster is not: the root knows nothing of a leaf's
// nodes or policy. Its connection goes as a transport channel over the
// leaf's tunnel (on this proxy, else through a peer proxy holding one)
// to the leaf's proxy, with a proxyapi.LeafRequest naming the target and
// the user's certificate; the leaf's own Router (LeafTransport) decides.
//
// Which clusters exist is never told to a user who may not reach them:
// an unknown cluster, a leaf without a live tunnel, and a leaf whose
// role_map gives the user nothing all answer `cluster "X" not found`.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gravitational/trace"
	"github.com/jonboulle/clockwork"
	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/proxyapi"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

// LeafTunnels is what the Router uses of the tunnels from leaf clusters
// on this proxy (*reversetunnel.Leaves).
type LeafTunnels interface {
	// LeafName is the cluster name of the leaf with a tunnel here that
	// name (any case) means; false when none is here.
	LeafName(name string) (string, bool)
	// DialLeaf opens a transport channel to the leaf's proxy; NotFound
	// when no tunnel from it is here.
	DialLeaf(ctx context.Context, name, source, destination string) (net.Conn, error)
}

// RemoteClusterLister lists this cluster's leaves (their remote_cluster
// records, with status and last_connected): Sites reads it for what it
// shows. Cached by the caller or cheap.
type RemoteClusterLister func(ctx context.Context) ([]services.RemoteCluster, error)

// leafAccessTTL is how long a leaf's answer to "may this certificate
// reach you" is reused for listings (proxysites, /webapi/clusters): a
// listing asks every online leaf, and a user's picker refreshes often.
// Routing never uses it: every dial is decided by the leaf.
const leafAccessTTL = 10 * time.Second

// leafAccessTimeout bounds a leaf's answer to a LeafKindAccess request.
const leafAccessTimeout = 5 * time.Second

// leafAccessCache remembers leaves' LeafKindAccess answers per
// certificate and leaf.
type leafAccessCache struct {
	mu sync.Mutex
	m  map[leafAccessKey]leafAccessEntry
}

type leafAccessKey struct {
	cert [32]byte
	leaf string
}

type leafAccessEntry struct {
	ok  bool
	exp time.Time
}

// leafSeenTTL is how long a leaf's acceptance of a certificate is
// remembered for telling its holder `cluster "X" is offline` (instead of
// not found) while no tunnel from the leaf is up: only users the leaf
// itself accepted learn that it exists.
const leafSeenTTL = time.Hour

// leafSeen remembers the leaves that accepted a certificate (a dial, a
// node list, an access answer), and when.
type leafSeen struct {
	mu sync.Mutex
	m  map[leafAccessKey]time.Time
}

func leafKey(cert *ssh.Certificate, leaf string) leafAccessKey {
	return leafAccessKey{cert: sha256.Sum256(cert.Marshal()), leaf: strings.ToLower(leaf)}
}

// saw records the leaf's answer for cert: accepted, or refused (which
// forgets an earlier acceptance).
func (r *Router) saw(cert *ssh.Certificate, leaf string, accepted bool) {
	if cert == nil {
		return
	}
	k := leafKey(cert, leaf)
	r.seen.mu.Lock()
	defer r.seen.mu.Unlock()
	if !accepted {
		delete(r.seen.m, k)
		return
	}
	if r.seen.m == nil || len(r.seen.m) > 10000 {
		r.seen.m = map[leafAccessKey]time.Time{}
	}
	r.seen.m[k] = r.cfg.Clock.Now()
}

func (r *Router) seenRecently(cert *ssh.Certificate, leaf string) bool {
	if cert == nil {
		return false
	}
	r.seen.mu.Lock()
	defer r.seen.mu.Unlock()
	at, ok := r.seen.m[leafKey(cert, leaf)]
	return ok && r.cfg.Clock.Since(at) < leafSeenTTL
}

// leafRoute is the root's whole decision for a target resolved to a
// leaf: which leaf. The leaf's Router picks the node when DialHost (or
// ExplainRequest) asks it, so Node and Candidates stay empty.
func leafRoute(res resolved, strategy string) Route {
	leaf := res.target.Cluster
	return Route{
		Cluster: leaf, Target: res.target, Strategy: strategy, Leaf: true,
		Reason: res.suffixNote + "cluster " + leaf + " is a leaf cluster: its proxy routes " + quoteHost(res.target.Host) +
			" with its own inventory and routing_strategy",
	}
}

// leafTarget is the target as the leaf is to read it: HOST[:PORT].
func leafTarget(t Target) string {
	if t.Port == "" {
		return t.Host
	}
	return net.JoinHostPort(t.Host, t.Port)
}

// dialLeaf opens route's connection through leaf route.Cluster: the
// leaf's Router picks the node; its reply maps to what the user is told.
//
// An OpenSSH node of the leaf is named in the leaf's reply; the caller
// gets it as the Route's LeafOpenSSH.
func (r *Router) dialLeaf(ctx context.Context, req RouteRequest, route Route) (net.Conn, *proxyapi.LeafOpenSSHNode, error) {
	src := req.Source
	if src == "" {
		src = utils.ClientAddr(ctx)
	}
	conn, reply, err := r.leafExchange(ctx, route.Cluster, req.Cert, proxyapi.LeafRequest{
		Target: leafTarget(route.Target), Source: src, Kind: proxyapi.LeafKindDial,
	})
	if err != nil {
		return nil, nil, trace.Wrap(err)
	}
	if err := r.leafReplyError(route.Cluster, req.Cert, reply); err != nil {
		conn.Close()
		var ld *LeafDeniedError
		r.saw(req.Cert, route.Cluster, !errors.As(err, &ld))
		if ld != nil && bySuffix(req, route) {
			// Reached by rule 0 (HOST.LEAF): an unknown suffix is a
			// plain local miss, so this must read as one too.
			ld.visible = nodeNotFound(req.Target.Host, r.cfg.ClusterName).(*trace.NotFoundError)
		}
		return nil, nil, err
	}
	r.saw(req.Cert, route.Cluster, true)
	return conn, reply.OpenSSH, nil
}

// explainLeaf completes e, the root's part of explaining route (which
// leaf, over which tunnel), with the leaf's own explanation for
// req.Cert, asked over the leaf's tunnel (LeafKindRoute: the leaf's
// Router, inventory and routing_strategy, among what the leaf's RBAC
// lets the mapped roles see). A leaf that refuses the caller reads like
// an unknown cluster: `cluster "X" not found` for `@X`, and for HOST.X
// the local miss's explanation (what an unknown suffix gives).
func (r *Router) explainLeaf(ctx context.Context, req RouteRequest, e Explanation, route Route) (Explanation, error) {
	src := req.Source
	if src == "" {
		src = utils.ClientAddr(ctx)
	}
	conn, reply, err := r.leafExchange(ctx, route.Cluster, req.Cert, proxyapi.LeafRequest{
		Target: leafTarget(route.Target), Source: src, Kind: proxyapi.LeafKindRoute,
	})
	if err != nil {
		return Explanation{}, trace.Wrap(err)
	}
	conn.Close()
	if err := r.leafReplyError(route.Cluster, req.Cert, reply); err != nil {
		var ld *LeafDeniedError
		r.saw(req.Cert, route.Cluster, !errors.As(err, &ld))
		if ld != nil && bySuffix(req, route) {
			// Rule 0 (HOST.LEAF): explained as the local miss an
			// unknown suffix gives, which is what routing says too.
			miss := Route{Cluster: r.cfg.ClusterName, Target: Target{Host: req.Target.Host, Port: req.Target.Port, Cluster: r.cfg.ClusterName}, Strategy: e.Strategy}
			me := NewExplanation(miss)
			me.Target = req.Target.String()
			me.Error = nodeNotFound(req.Target.Host, r.cfg.ClusterName).Error()
			return me, nil
		}
		return Explanation{}, err
	}
	r.saw(req.Cert, route.Cluster, true)
	e.LeafRoute = reply.Explanation
	e.LeafFailed = reply.RouteFailed
	return e, nil
}

// bySuffix reports whether route reached its leaf by rule 0 (HOST.LEAF,
// with or without the local cluster named as @ROOT) rather than by
// `@LEAF`: only then was the suffix stripped from the host.
func bySuffix(req RouteRequest, route Route) bool {
	return route.Target.Host != req.Target.Host
}

// leafVia says over which tunnel a leaf is reached from here.
func (r *Router) leafVia(leaf string) string {
	if r.cfg.Leaves == nil {
		// pctl route: no tunnels of its own.
	} else if _, ok := r.cfg.Leaves.LeafName(leaf); ok {
		return "the leaf's tunnel on this proxy"
	}
	if holders := r.peerHolders(services.LeafTunnelID(leaf)); len(holders) > 0 {
		return "the leaf's tunnel on proxy " + strings.Join(holders, ", ")
	}
	return "the leaf's tunnel (none is up now)"
}

// LeafNodes lists the nodes of leaf cluster that the holder of cert may
// see there, as the leaf's RBAC decides (the `nodes@LEAF` subsystem,
// GET /webapi/nodes?cluster=LEAF). A cluster that is not a reachable
// leaf, or whose leaf refuses the user: `cluster "X" not found`.
func (r *Router) LeafNodes(ctx context.Context, cluster string, cert *ssh.Certificate, source string) ([]proxyapi.NodeEntry, error) {
	leaf, ok := r.leafName(cluster)
	if !ok {
		return nil, clusterNotFound(cluster)
	}
	conn, reply, err := r.leafExchange(ctx, leaf, cert, proxyapi.LeafRequest{Source: source, Kind: proxyapi.LeafKindNodes})
	if err != nil {
		return nil, trace.Wrap(err)
	}
	conn.Close()
	if err := r.leafReplyError(leaf, cert, reply); err != nil {
		var ld *LeafDeniedError
		r.saw(cert, leaf, !errors.As(err, &ld))
		return nil, err
	}
	r.saw(cert, leaf, true)
	if reply.Nodes == nil {
		return []proxyapi.NodeEntry{}, nil
	}
	for i := range reply.Nodes {
		// Whatever the leaf says, its nodes are its own: a leaf cannot
		// list nodes as the root's or another cluster's.
		reply.Nodes[i].Cluster = leaf
	}
	return reply.Nodes, nil
}

// leafReplyError maps a leaf's refusal to what the user is told: denied
// (the roles map to nothing there) and a request the leaf could not read
// read like an unknown cluster; a node the leaf does not show or finds
// ambiguous carries the leaf's own message (which never names a node the
// user may not see).
func (r *Router) leafReplyError(cluster string, cert *ssh.Certificate, reply proxyapi.LeafReply) error {
	switch reply.Kind {
	case "":
		if reply.Error == "" {
			return nil
		}
		return trace.ConnectionProblem(nil, "leaf cluster %q: %s", cluster, reply.Error)
	case proxyapi.LeafDenied, proxyapi.LeafBadRequest:
		r.cfg.Logger.WithFields(logrus.Fields{"cluster": cluster, "user": certUser(cert), "kind": reply.Kind, "reply": reply.Error}).Info("Leaf cluster refused the user; telling them it is not found.")
		return &LeafDeniedError{Cluster: cluster, Reason: reply.Kind + ": " + reply.Error, visible: clusterNotFoundErr(cluster)}
	case proxyapi.LeafNotFound:
		return &trace.NotFoundError{Message: reply.Error}
	case proxyapi.LeafAmbiguous:
		return &trace.BadParameterError{Message: reply.Error}
	default:
		return trace.ConnectionProblem(nil, "leaf cluster %q: %s", cluster, reply.Error)
	}
}

// LeafDeniedError is a leaf's refusal of the user as a whole (its
// role_map gives them nothing). It reads exactly like a cluster that does
// not exist (also to trace.IsNotFound): `cluster "X" not found` for
// `@X`, and for `HOST.X` the local miss `node "HOST.X" not found in
// cluster "ROOT"` that an unknown X gives. Reason is for the root's logs
// and audit only.
type LeafDeniedError struct {
	Cluster string
	Reason  string
	visible *trace.NotFoundError
}

func (e *LeafDeniedError) Error() string { return e.visible.Error() }

// Unwrap makes trace.IsNotFound recognise it as the not-found it reads
// as.
func (e *LeafDeniedError) Unwrap() error { return e.visible }

func certUser(cert *ssh.Certificate) string {
	if cert == nil {
		return ""
	}
	if u := cert.Permissions.Extensions[services.CertExtensionUser]; u != "" {
		return u
	}
	return cert.KeyId
}

// leafExchange opens a transport channel to leaf (a tunnel here, else a
// peer holding one), sends req with cert and reads the leaf's reply,
// bounded by DefaultLeafRequestTimeout. On success conn is positioned at
// what follows the reply (the node's SSH bytes for a dial).
func (r *Router) leafExchange(ctx context.Context, leaf string, cert *ssh.Certificate, req proxyapi.LeafRequest) (net.Conn, proxyapi.LeafReply, error) {
	var reply proxyapi.LeafReply
	if cert == nil {
		// Nothing for the leaf to decide on: nobody gets in without one.
		return nil, reply, clusterNotFound(leaf)
	}
	req.Cert = string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(cert)))
	line, err := json.Marshal(req)
	if err != nil {
		return nil, reply, trace.Wrap(err)
	}
	timeout := DefaultLeafRequestTimeout
	if req.Kind == proxyapi.LeafKindAccess {
		// A listing asks every leaf at once: one that hangs must not
		// hold the user's proxysites (or cluster picker) for long.
		timeout = leafAccessTimeout
	}
	ctx, cancel := clockwork.WithTimeout(ctx, r.cfg.Clock, timeout)
	defer cancel()
	conn, err := r.openLeaf(ctx, leaf, req.Source, req.Target)
	if err != nil {
		return nil, reply, trace.Wrap(err)
	}
	// A leaf that does not answer in time (or a canceled caller) must
	// not hold the user forever: closing unblocks the read.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	_, err = conn.Write(append(line, '\n'))
	if err == nil {
		max, buffered := int64(proxyapi.MaxLeafRequest), req.Kind == proxyapi.LeafKindNodes || req.Kind == proxyapi.LeafKindRoute
		switch req.Kind {
		case proxyapi.LeafKindNodes:
			max = proxyapi.MaxLeafReply
		case proxyapi.LeafKindRoute:
			// The text, JSON-escaped (at most 6 bytes per byte, as
			// \u003c), and the rest of the reply.
			max = 6*proxyapi.MaxLeafExplanation + proxyapi.MaxLeafRequest
		}
		reply, err = readLeafReply(conn, max, buffered)
	}
	if !stop() {
		conn.Close()
		return nil, reply, trace.ConnectionProblem(context.Cause(ctx), "leaf cluster %q did not answer: %v", leaf, context.Cause(ctx))
	}
	if err != nil {
		conn.Close()
		return nil, reply, trace.ConnectionProblem(err, "leaf cluster %q: %v", leaf, err)
	}
	return conn, reply, nil
}

// openLeaf opens a transport channel to leaf: over its tunnel on this
// proxy, else through the peers that lease one.
func (r *Router) openLeaf(ctx context.Context, leaf, src, dst string) (net.Conn, error) {
	if r.cfg.Leaves != nil {
		conn, err := r.cfg.Leaves.DialLeaf(ctx, leaf, src, dst)
		if err == nil {
			return conn, nil
		}
		if !trace.IsNotFound(err) {
			r.metrics.dialFailures.Inc()
			return nil, trace.Wrap(err)
		}
	}
	id := services.LeafTunnelID(leaf)
	holders := r.peerHolders(id)
	if len(holders) == 0 {
		// The tunnel went away since the cluster was resolved.
		return nil, clusterNotFound(leaf)
	}
	conn, peer, err := r.dialPeers(ctx, holders, id, src, dst)
	if err != nil {
		return nil, trace.ConnectionProblem(err, "cluster %q is unreachable: its tunnel is on another proxy, which did not answer: %v", leaf, trace.UserMessage(err))
	}
	r.cfg.Logger.WithFields(logrus.Fields{"cluster": leaf, "peer": peer}).Debug("Reached a leaf cluster through a peer proxy.")
	return conn, nil
}

// readLeafReply reads one JSON line. A dial's reply is read byte by byte:
// what follows the newline is the node's and must stay unread. A node
// list (buffered) is the last thing on its channel.
func readLeafReply(r io.Reader, max int64, buffered bool) (proxyapi.LeafReply, error) {
	var reply proxyapi.LeafReply
	var line []byte
	if buffered {
		b, err := bufio.NewReader(io.LimitReader(r, max+1)).ReadBytes('\n')
		if err != nil {
			return reply, trace.ConnectionProblem(err, "reading the leaf's reply: %v", err)
		}
		line = bytes.TrimSuffix(b, []byte("\n"))
	} else {
		b := make([]byte, 1)
		for {
			if _, err := io.ReadFull(r, b); err != nil {
				return reply, trace.ConnectionProblem(err, "reading the leaf's reply: %v", err)
			}
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
			if int64(len(line)) > max {
				return reply, trace.BadParameter("leaf reply longer than %d bytes", max)
			}
		}
	}
	if err := json.Unmarshal(line, &reply); err != nil {
		return reply, trace.BadParameter("malformed leaf reply: %v", err)
	}
	return reply, nil
}

// leafMayReach asks leaf whether cert's roles map to anything there,
// cached leafAccessTTL. An unreachable leaf answers no.
func (r *Router) leafMayReach(ctx context.Context, leaf string, cert *ssh.Certificate) bool {
	key := leafKey(cert, leaf)
	now := r.cfg.Clock.Now()
	r.access.mu.Lock()
	if e, ok := r.access.m[key]; ok && now.Before(e.exp) {
		r.access.mu.Unlock()
		return e.ok
	}
	r.access.mu.Unlock()
	conn, reply, err := r.leafExchange(ctx, leaf, cert, proxyapi.LeafRequest{Source: utils.ClientAddr(ctx), Kind: proxyapi.LeafKindAccess})
	if err != nil {
		r.cfg.Logger.WithError(err).WithField("cluster", leaf).Debug("Cannot ask a leaf cluster about a user.")
		return false
	}
	conn.Close()
	ok := reply.Kind == "" && reply.Error == ""
	if ok || reply.Kind == proxyapi.LeafDenied {
		r.saw(cert, leaf, ok)
	}
	r.access.mu.Lock()
	defer r.access.mu.Unlock()
	if r.access.m == nil || len(r.access.m) > 10000 {
		r.access.m = map[leafAccessKey]leafAccessEntry{}
	}
	r.access.m[key] = leafAccessEntry{ok: ok, exp: now.Add(leafAccessTTL)}
	return ok
}

// Sites lists the clusters the holder of cert may reach (proxysites,
// GET /webapi/clusters): the local one first, always online, then every
// leaf with a live tunnel here or on a peer whose role_map gives cert
// something, by name, and, as offline, a leaf without a tunnel that
// accepted cert within leafSeenTTL. A leaf the user may not reach is not listed, so
// the list reveals nothing the user could not find by routing. A nil
// cert lists the local cluster only.
func (r *Router) Sites(ctx context.Context, cert *ssh.Certificate) []proxyapi.Site {
	out := []proxyapi.Site{{Name: r.cfg.ClusterName, Status: proxyapi.SiteOnline, LastConnected: r.cfg.Clock.Now().UTC()}}
	if cert == nil || r.cfg.Leaves == nil || r.cfg.RemoteClusters == nil {
		return out
	}
	rcs, err := r.cfg.RemoteClusters(ctx)
	if err != nil {
		r.cfg.Logger.WithError(err).Warn("Cannot list leaf clusters.")
		return out
	}
	type result struct {
		site proxyapi.Site
		ok   bool
	}
	results := make([]result, len(rcs))
	var wg sync.WaitGroup
	for i, rc := range rcs {
		leaf, ok := r.leafName(rc.Name)
		if !ok {
			// No tunnel up: listed offline only to a user it accepted.
			if r.seenRecently(cert, rc.Name) {
				results[i] = result{proxyapi.Site{Name: rc.Name, Status: proxyapi.SiteOffline, LastConnected: rc.LastConnected.UTC()}, true}
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r.leafMayReach(ctx, leaf, cert) {
				last := rc.LastConnected
				if last.IsZero() {
					last = r.cfg.Clock.Now()
				}
				results[i] = result{proxyapi.Site{Name: rc.Name, Status: proxyapi.SiteOnline, LastConnected: last.UTC()}, true}
			}
		}()
	}
	wg.Wait()
	var leaves []proxyapi.Site
	for _, res := range results {
		if res.ok {
			leaves = append(leaves, res.site)
		}
	}
	slices.SortFunc(leaves, func(a, b proxyapi.Site) int { return strings.Compare(a.Name, b.Name) })
	return append(out, leaves...)
}
