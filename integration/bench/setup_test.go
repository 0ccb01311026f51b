package bench

import (
	"testing"
	"time"
)

// BenchmarkJumpSetup is the cost of `ssh -J` through the proxy against a
// direct connection to the node, with the x/crypto client: handshake(s),
// authentication, routing, the direct-tcpip dial and one session channel.
// Each op does one of each, interleaved, so that both see the same machine
// load; the metrics are the two latencies and their ratio. (No command
// runs: a login shell's start-up would only add the same constant to both.)
func BenchmarkJumpSetup(b *testing.B) {
	c := getCluster(b)
	cr := c.creds()
	var direct, jump time.Duration
	for i := 0; i < b.N; i++ {
		d, err := setupOnce(cr, "", c.node)
		if err != nil {
			b.Fatal(err)
		}
		j, err := setupOnce(cr, c.proxy, c.node)
		if err != nil {
			b.Fatal(err)
		}
		direct += d
		jump += j
	}
	b.ReportMetric(float64(direct.Microseconds())/1000/float64(b.N), "direct-ms/op")
	b.ReportMetric(float64(jump.Microseconds())/1000/float64(b.N), "jump-ms/op")
	b.ReportMetric(float64(jump)/float64(direct), "jump/direct")
}

func setupOnce(cr credentials, proxyAddr, nodeAddr string) (time.Duration, error) {
	start := time.Now()
	h, err := dialNode(cr, proxyAddr, nodeAddr, nil)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	s, err := h.node.NewSession()
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	s.Close()
	return d, nil
}
