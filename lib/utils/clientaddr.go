package utils

import "context"

type clientAddrKey struct{}

// WithClientAddr returns ctx carrying the address of the client a
// connection's work is for. The SSH server sets it on every connection's
// context, so that whatever the connection makes the proxy dial (a tunnel
// node, which names the client in its audit log) knows who asked without
// threading the address through every handler interface.
func WithClientAddr(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, clientAddrKey{}, addr)
}

// ClientAddr is the address WithClientAddr put in ctx, or "".
func ClientAddr(ctx context.Context) string {
	s, _ := ctx.Value(clientAddrKey{}).(string)
	return s
}
