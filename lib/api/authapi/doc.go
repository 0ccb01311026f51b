// Package authapi holds the bodies of the auth API (lib/auth's APIServer,
// /v1/...) and its error format: what the auth server and every caller of
// it (its Client, pctl, a joining host) must agree on byte for byte. See
// package api for why it imports nothing of the servers.
package authapi
