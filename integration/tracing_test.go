package integration

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/observe"
	"github.com/postern-dev/postern/lib/service"
)

// otlpSpan is one received span with the process it came from.
type otlpSpan struct {
	instance string // service.instance.id: the process's nodename
	span     *tracepb.Span
}

// otlpReceiver is an OTLP/HTTP collector: it decodes what the processes
// POST to /v1/traces with the collector's protobuf types.
type otlpReceiver struct {
	addr string
	mu   sync.Mutex
	got  []otlpSpan
	bad  []string
}

func newOTLPReceiver(t *testing.T, host string) *otlpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	r := &otlpReceiver{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *otlpReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	msg := &collectortrace.ExportTraceServiceRequest{}
	if err == nil && (req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf") {
		err = os.ErrInvalid
	}
	if err == nil {
		err = proto.Unmarshal(body, msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.bad = append(r.bad, req.URL.Path+": "+err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, rs := range msg.ResourceSpans {
		var instance string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.instance.id" {
				instance = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.got = append(r.got, otlpSpan{instance: instance, span: sp})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (r *otlpReceiver) spans() []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]otlpSpan(nil), r.got...)
}

func attr(sp *tracepb.Span, key string) string {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestTracingOneTrace: one `ssh -J` session through proxy B to a tunnel
// node whose only tunnel is on proxy A (peering) is ONE trace at the
// collector, with spans from all three processes (B routes and dials the
// peer, A serves the peered dial, the node accepts and runs the session,
// each a child of the hop before), and the node keeps B's connection id.
// A refused route is a route span with error status and the reason. The
// node is the built `postern start`, its tracing from postern.yaml.
func TestTracingOneTrace(t *testing.T) {
	requireOpenSSH(t, "ssh")
	// Export at once rather than every 5s (the SDK's batch delay).
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	ns := newNetNS(t)
	recv := newOTLPReceiver(t, ns.hostIP)
	rate := 1.0
	tracing := observe.TracingConfig{Exporter: observe.ExporterOTLP, Endpoint: recv.addr, SamplingRate: &rate}

	c := newAllInOneWith(t, func(cfg *config.Config) {
		cfg.WebAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.TunnelAddr = net.JoinHostPort(ns.hostIP, "0")
		cfg.PublicAddrs = []string{ns.hostIP}
		cfg.Tracing = tracing
	})
	clt := adminClient(t, c.dataDir, c.p)
	m := joinRe.FindStringSubmatch(mustPctl(t, c.dataDir, "", "tokens", "add", "--type", "proxy"))
	require.NotNil(t, m)
	bcfg := procConfig(t.TempDir(), config.RoleProxy)
	bcfg.AuthServer, bcfg.Token, bcfg.CAPin, bcfg.NodeName = c.p.Addr(service.ListenerAuth).String(), m[1], m[2], "edge-b"
	bcfg.Tracing = tracing
	pb := startProcess(t, bcfg)
	waitProxies(t, clt, 2)

	yaml := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(yaml, []byte("tracing:\n  exporter: otlp\n  endpoint: "+recv.addr+"\n  sampling_rate: 1.0\n"), 0o600))
	_, rec := startNSNode(t, ns, c, clt, "natted", "--config", yaml)
	waitLease(t, clt, rec.UUID, c.p.HostUUID())
	require.NotContains(t, leaseHolders(t, clt, rec.UUID), pb.HostUUID(), "the node must have no tunnel on proxy B")

	cfg := c.opensshConfigVia(t, pb.Addr(service.ListenerProxySSH), "natted")
	out, err := exec.Command("ssh", "-F", cfg, "natted", "echo traced").CombinedOutput()
	require.NoError(t, err, string(out))
	require.Equal(t, "traced\n", string(out))

	// The node's session span ends with the session; every process
	// exports within its batch delay.
	var trace []otlpSpan
	require.Eventually(t, func() bool {
		all := recv.spans()
		for _, s := range all {
			if s.instance != "natted" || s.span.Name != "ssh.session" {
				continue
			}
			trace = trace[:0]
			for _, x := range all {
				if string(x.span.TraceId) == string(s.span.TraceId) {
					trace = append(trace, x)
				}
			}
			has := func(instance, name string) bool {
				for _, x := range trace {
					if x.instance == instance && x.span.Name == name {
						return true
					}
				}
				return false
			}
			if has("edge-b", "ssh.accept") && has("edge-b", "route") && has("edge-b", "dial.peer") &&
				has("node-1", "peer.serve") && has("natted", "ssh.accept") {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "no trace with spans from proxy B, peer A and the node")

	byID := map[string]otlpSpan{}
	for _, s := range trace {
		byID[string(s.span.SpanId)] = s
	}
	find := func(instance, name string) *tracepb.Span {
		for _, s := range trace {
			if s.instance == instance && s.span.Name == name {
				return s.span
			}
		}
		t.Fatalf("no span %s from %s", name, instance)
		return nil
	}
	// Each hop's first span is a child of the hop before it.
	require.Equal(t, "dial.peer", byID[string(find("node-1", "peer.serve").ParentSpanId)].span.Name)
	require.Equal(t, "edge-b", byID[string(find("node-1", "peer.serve").ParentSpanId)].instance)
	nodeAccept := find("natted", "ssh.accept")
	require.Equal(t, "node-1", byID[string(nodeAccept.ParentSpanId)].instance)
	require.Empty(t, find("edge-b", "ssh.accept").ParentSpanId, "the first proxy starts the trace")
	// One connection id across the hops.
	connID := attr(find("edge-b", "ssh.accept"), "postern.conn_id")
	require.NotEmpty(t, connID)
	require.Equal(t, connID, attr(nodeAccept, "postern.conn_id"))

	t.Run("a refused route is an error span with the reason", func(t *testing.T) {
		cfg := c.opensshConfigVia(t, pb.Addr(service.ListenerProxySSH), "nosuchhost")
		out, err := exec.Command("ssh", "-F", cfg, "nosuchhost", "true").CombinedOutput()
		require.Error(t, err, string(out))
		require.Eventually(t, func() bool {
			for _, s := range recv.spans() {
				if s.instance == "edge-b" && s.span.Name == "route" &&
					s.span.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR &&
					strings.Contains(s.span.GetStatus().GetMessage(), `"nosuchhost"`) {
					return true
				}
			}
			return false
		}, 30*time.Second, 50*time.Millisecond, "no error route span for nosuchhost")
	})
	recv.mu.Lock()
	require.Empty(t, recv.bad)
	recv.mu.Unlock()
}

// TestTracingConfigThroughStart: a broken tracing section stops `postern
// start` with the key at fault named.
func TestTracingConfigThroughStart(t *testing.T) {
	yaml := filepath.Join(t.TempDir(), "postern.yaml")
	require.NoError(t, os.WriteFile(yaml, []byte("tracing: {exporter: otlp, endpoint: 'collector', sampling_rate: 1}\n"), 0o600))
	out, err := exec.Command(bin("postern"), "start", "--roles", "auth", "--data-dir", t.TempDir(), "--config", yaml).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `tracing.endpoint "collector": want HOST:PORT or https://HOST:PORT`)
}
