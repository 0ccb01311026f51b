//go:build !linux

package auth

import "net"

// streamPair is an in-memory pipe where socket pairs are not available.
func streamPair() (net.Conn, net.Conn, error) {
	a, b := net.Pipe()
	return a, b, nil
}
