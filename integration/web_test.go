package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/webapi"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/web"
)

// tcpConnsOnPort lists the kernel's non-listening TCP sockets (IPv4 and
// IPv6, TIME_WAIT included) whose local or remote port is port, as
// "local remote" pairs: who has connected to a listener, seen from outside
// Postern. A connection made and closed since an earlier call shows up as
// a new pair (its ephemeral port is new).
func tcpConnsOnPort(t *testing.T, port int) map[string]bool {
	t.Helper()
	conns := map[string]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] == "0A" { // 0A: LISTEN
				continue
			}
			for _, addr := range fields[1:3] {
				i := strings.LastIndexByte(addr, ':')
				p, err := strconv.ParseUint(addr[i+1:], 16, 16)
				require.NoError(t, err)
				if int(p) == port {
					conns[fields[1]+" "+fields[2]] = true
					break
				}
			}
		}
		f.Close()
	}
	return conns
}

// newConns is what after has that before had not.
func newConns(before, after map[string]bool) []string {
	var out []string
	for c := range after {
		if !before[c] {
			out = append(out, c)
		}
	}
	return out
}

func portOf(t *testing.T, a net.Addr) int {
	t.Helper()
	return a.(*net.TCPAddr).Port
}

// TestWebTerminalIsInProcess is issue 6's architectural promise: a browser
// session reaches its node through the process's own Router, never by
// dialing the proxy's SSH port. While a web terminal runs a real shell on
// the node, the kernel shows no connection on the proxy's SSH port, and
// does show the proxy's connection to the node.
func TestWebTerminalIsInProcess(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI runs on Linux, which has /proc/net/tcp: %v", err)
		}
		t.Skip("needs /proc/net/tcp (Linux)")
	}
	c := newAllInOne(t)
	sshPort := portOf(t, c.p.Addr(service.ListenerProxySSH))
	nodePort := portOf(t, c.p.Addr(service.ListenerNode))
	webAddr := c.p.Addr(service.ListenerWeb).String()

	// The probe works: an SSH client on the proxy port is seen.
	proxyClient, err := ssh.Dial("tcp", c.p.Addr(service.ListenerProxySSH).String(), c.clientConfig(t))
	require.NoError(t, err)
	require.NotEmpty(t, tcpConnsOnPort(t, sshPort))
	proxyClient.Close()
	before := tcpConnsOnPort(t, sshPort)
	nodeBefore := tcpConnsOnPort(t, nodePort)

	// A browser session: log in over HTTPS, open the terminal websocket.
	caPEM, err := os.ReadFile(filepath.Join(c.dataDir, "web", web.SelfSignedCertFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	resp, err := hc.Post("https://"+webAddr+"/webapi/sessions", "application/json",
		strings.NewReader(`{"user":"alice","password":"correct horse battery","otp_token":""}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var sess webapi.CreateSessionResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sess))
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == web.SessionCookieName {
			cookie = ck
		}
	}
	require.NotNil(t, cookie)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	params, err := json.Marshal(web.TerminalParams{Host: c.hostname, Login: c.login, Cols: 100, Rows: 30})
	require.NoError(t, err)
	ws, _, err := websocket.Dial(ctx, "wss://"+webAddr+"/webapi/terminal?params="+url.QueryEscape(string(params)), &websocket.DialOptions{
		HTTPClient:   hc,
		HTTPHeader:   http.Header{"Cookie": {web.SessionCookieName + "=" + cookie.Value}},
		Subprotocols: []string{web.TerminalSubprotocol},
	})
	require.NoError(t, err)
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(fmt.Sprintf(`{"token":%q}`, sess.Token))))
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	require.JSONEq(t, `{"status":"ok"}`, string(msg))

	require.NoError(t, ws.Write(ctx, websocket.MessageBinary, web.EncodeFrame(web.FrameData, []byte("echo in-$((40+2))-process; stty size\n"))))
	var screen strings.Builder
	for !strings.Contains(screen.String(), "in-42-process") || !strings.Contains(screen.String(), "30 100") {
		_, msg, err := ws.Read(ctx)
		require.NoError(t, err, "screen so far: %q", screen.String())
		f, err := web.DecodeFrame(msg)
		require.NoError(t, err)
		if f.Type == web.FrameError {
			t.Fatalf("terminal error: %s", f.Payload)
		}
		if f.Type == web.FrameData {
			screen.Write(f.Payload)
		}
	}

	// The shell is live on the node, and nothing touched the proxy port.
	require.NotEmpty(t, newConns(nodeBefore, tcpConnsOnPort(t, nodePort)), "the web terminal's connection to the node")
	require.Empty(t, newConns(before, tcpConnsOnPort(t, sshPort)), "the web terminal must not dial the proxy's SSH port")

	require.NoError(t, ws.Write(ctx, websocket.MessageBinary, web.EncodeFrame(web.FrameData, []byte("exit 7\n"))))
	for {
		_, msg, err := ws.Read(ctx)
		if err != nil {
			require.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), err.Error())
			break
		}
		f, err := web.DecodeFrame(msg)
		require.NoError(t, err)
		if f.Type == web.FrameClose {
			var cm web.CloseMessage
			require.NoError(t, json.Unmarshal(f.Payload, &cm))
			require.Equal(t, 7, cm.Code)
		}
	}
	require.Empty(t, newConns(before, tcpConnsOnPort(t, sshPort)))
}
