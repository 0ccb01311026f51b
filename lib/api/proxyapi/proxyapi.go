// Package proxyapi holds what the proxy's SSH port answers besides
// forwarding: the subsystems psh (and OpenSSH users) open on it and the
// JSON they return. See package api for why it imports nothing of the
// servers.
package proxyapi

import "time"

// SubsystemNodes is the subsystem that lists the nodes the caller may
// reach (what `psh ls` reads): a JSON array of NodeEntry, then the channel
// closes. It exists because the proxy port is the one place psh already
// authenticates with its certificate; the web listing needs a session.
const SubsystemNodes = "nodes"

// SubsystemSites is the subsystem that lists clusters: a JSON array of
// Site.
const SubsystemSites = "proxysites"

// NodeEntry is one node of the `nodes` subsystem's answer (and of
// GET /webapi/nodes).
type NodeEntry struct {
	UUID     string            `json:"uuid"`
	Hostname string            `json:"hostname"`
	Addr     string            `json:"addr"`
	Labels   map[string]string `json:"labels,omitempty"`
	Cluster  string            `json:"cluster"`
	// Logins are the certificate's logins the caller's roles allow on
	// this node.
	Logins []string `json:"logins"`
}

// Site is one entry of the `proxysites` answer.
type Site struct {
	Name          string    `json:"name"`
	Status        string    `json:"status"`
	LastConnected time.Time `json:"last_connected"`
}

// SiteOnline is the status of a reachable cluster.
const SiteOnline = "online"
