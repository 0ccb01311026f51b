// Package bench measures a whole Postern cluster, started in-process on
// loopback ports, with x/crypto/ssh clients: session and -L throughput,
// ssh -J setup through the proxy against a direct connection, and memory per
// idle forwarded session. bench/postern-vs-openssh.sh measures the same
// things with the real OpenSSH client against an sshd bastion; these
// benchmarks are the quick, repeatable half that `make bench` always runs.
//
// One cluster serves every benchmark of a run (starting one costs about a
// second, more than most benchmarks), and it is only started when a
// benchmark asks for it, so `go test` without -bench starts nothing.
package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"go.uber.org/goleak"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/crypto/ssh"

	"github.com/postern-dev/postern/lib/api/authapi"
	"github.com/postern-dev/postern/lib/auth"
	"github.com/postern-dev/postern/lib/config"
	"github.com/postern-dev/postern/lib/service"
	"github.com/postern-dev/postern/lib/services"
	"github.com/postern-dev/postern/lib/utils"
)

const clusterName = "bench"

// benchLoginEnv names an extra OS login for BenchmarkOpenSSHJumpSetup.
const benchLoginEnv = "POSTERN_BENCH_LOGIN"

func TestMain(m *testing.M) {
	// The memory benchmark re-executes this binary to hold its idle
	// clients in another process, so their memory is not counted.
	if os.Getenv(helperEnv) != "" {
		os.Exit(runClientHelper())
	}
	code := m.Run()
	stopCluster()
	if code == 0 {
		if err := goleak.Find(
			// net/http's keep-alive connections of the auth client end
			// on their own after their idle timeout.
			goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// cluster is an all-in-one (auth, proxy, node) process and the credentials
// of one user allowed to log in as the OS user running the benchmarks.
type cluster struct {
	p       *service.Process
	dir     string
	login   string
	proxy   string // proxy SSH address
	node    string // node SSH address
	keyPEM  []byte
	certPub []byte
	hostCAs [][]byte // wire-format host CA keys
}

var (
	clusterMu  sync.Mutex
	theCluster *cluster
)

// getCluster starts the shared cluster on first use.
func getCluster(b *testing.B) *cluster {
	b.Helper()
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if theCluster != nil {
		return theCluster
	}
	c, err := startCluster()
	if err != nil {
		b.Fatalf("starting the cluster: %v", err)
	}
	theCluster = c
	return c
}

func stopCluster() {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if theCluster == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := theCluster.p.Shutdown(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster shutdown:", err)
	}
	os.RemoveAll(theCluster.dir)
	theCluster = nil
}

func startCluster() (*cluster, error) {
	dir, err := os.MkdirTemp("", "postern-bench-")
	if err != nil {
		return nil, err
	}
	c, err := startClusterIn(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func startClusterIn(dir string) (*cluster, error) {
	cfg := &config.Config{FileConfig: config.FileConfig{
		DataDir:     dir,
		Roles:       []string{config.RoleAuth, config.RoleProxy, config.RoleNode},
		ClusterName: clusterName,
		NodeName:    "bench-node",
		NodeAddr:    "127.0.0.1:0",
		SSHAddr:     "127.0.0.1:0",
		WebAddr:     "127.0.0.1:0",
		AuthAddr:    "127.0.0.1:0",
		DiagAddr:    "127.0.0.1:0",
		TunnelAddr:  "127.0.0.1:0",
		PeerAddr:    "127.0.0.1:0",
		// Every benchmark connection is one user from 127.0.0.1: lift the
		// caps so that POSTERN_BENCH_IDLE_CONNS=1000 measures sessions,
		// not the limiter.
		Limits: config.Limits{MaxConnectionsPerIP: -1, MaxConnectionsPerUser: -1, MaxSessionsPerUser: -1, MaxConnections: -1},
	}}
	// Warnings only: per-connection Info lines would be a cost of their
	// own in the numbers, and noise in the output.
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	p, err := service.New(cfg, service.Options{BcryptCost: bcrypt.MinCost, Logger: logger})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		p.Shutdown(ctx)
		return nil, err
	}
	c, err := enroll(ctx, p, dir)
	if err != nil {
		p.Shutdown(ctx)
		return nil, err
	}
	return c, nil
}

// enroll creates the user and its certificate, as `pctl users add` and
// `pctl auth sign` do, and waits for the node to be routable.
func enroll(ctx context.Context, p *service.Process, dir string) (*cluster, error) {
	id, err := auth.ReadIdentity(config.AdminIdentityDir(dir))
	if err != nil {
		return nil, err
	}
	clt, err := auth.NewClient(auth.ClientConfig{Addr: p.Addr(service.ListenerAuth).String(), Identity: id})
	if err != nil {
		return nil, err
	}
	defer clt.Close()
	u, err := user.Current()
	if err != nil {
		return nil, err
	}
	// POSTERN_BENCH_LOGIN adds a plain login (no shell rc files) for the
	// OpenSSH benchmark: root's here runs `pyenv init`, ~140 ms per command.
	logins := []string{u.Username}
	if l := os.Getenv(benchLoginEnv); l != "" {
		logins = append(logins, l)
	}
	if _, err := clt.CreateUser(ctx, "bench", []byte("correct horse battery"), logins, nil, false); err != nil {
		return nil, err
	}
	priv, pub, err := utils.GenerateKeyPair()
	if err != nil {
		return nil, err
	}
	cert, err := clt.GenerateUserCert(ctx, authapi.UserCertRequest{User: "bench", PublicKey: pub, TTL: 2 * time.Hour})
	if err != nil {
		return nil, err
	}
	ca, err := clt.GetCertAuthority(ctx, clusterName, services.HostCA, false)
	if err != nil {
		return nil, err
	}
	var hostCAs [][]byte
	for _, k := range ca.SSHPublicKeys {
		pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
		if err != nil {
			return nil, err
		}
		hostCAs = append(hostCAs, pk.Marshal())
	}
	for {
		nodes, err := clt.GetNodes(ctx, "")
		if err == nil && len(nodes) == 1 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the node never registered: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return &cluster{
		p: p, dir: dir, login: u.Username,
		proxy:   p.Addr(service.ListenerProxySSH).String(),
		node:    p.Addr(service.ListenerNode).String(),
		keyPEM:  priv,
		certPub: cert,
		hostCAs: hostCAs,
	}, nil
}

// credentials are what a client needs; the helper process gets them in
// files.
type credentials struct {
	login   string
	keyPEM  []byte
	certPub []byte
	hostCAs [][]byte
}

func (c *cluster) creds() credentials {
	return credentials{login: c.login, keyPEM: c.keyPEM, certPub: c.certPub, hostCAs: c.hostCAs}
}

// clientConfig is certificate auth with host certificates checked against
// the host CA. ciphers nil means x/crypto's default order (AES-GCM first).
func (cr credentials) clientConfig(ciphers []string) (*ssh.ClientConfig, error) {
	signer, err := ssh.ParsePrivateKey(cr.keyPEM)
	if err != nil {
		return nil, err
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey(cr.certPub)
	if err != nil {
		return nil, err
	}
	certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
	if err != nil {
		return nil, err
	}
	checker := &ssh.CertChecker{IsHostAuthority: func(a ssh.PublicKey, _ string) bool {
		for _, ca := range cr.hostCAs {
			if bytes.Equal(ca, a.Marshal()) {
				return true
			}
		}
		return false
	}}
	cfg := &ssh.ClientConfig{
		User:            cr.login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(certSigner)},
		HostKeyCallback: checker.CheckHostKey,
		Timeout:         30 * time.Second,
	}
	cfg.Ciphers = ciphers
	return cfg, nil
}

// hop is one connection to the node: direct, or through the proxy as
// `ssh -J` does (direct-tcpip to the node's address, then a second SSH
// handshake inside it).
type hop struct {
	node  *ssh.Client
	proxy *ssh.Client // nil when direct
}

func (h *hop) Close() error {
	err := h.node.Close()
	if h.proxy != nil {
		h.proxy.Close()
	}
	return err
}

func dialNode(cr credentials, proxyAddr, nodeAddr string, ciphers []string) (*hop, error) {
	return dialNodeFrom(cr, proxyAddr, nodeAddr, ciphers, nil)
}

// dialNodeFrom is dialNode from the local address src (nil: any). The
// proxy limits new connections per source address (20/s after a burst of
// 250); many sessions opened at once come from many loopback addresses
// (127.0.0.2, .3, ...: all of 127/8 is local) rather than waiting for it.
func dialNodeFrom(cr credentials, proxyAddr, nodeAddr string, ciphers []string, src net.IP) (*hop, error) {
	cfg, err := cr.clientConfig(ciphers)
	if err != nil {
		return nil, err
	}
	dial := func(addr string) (*ssh.Client, error) {
		d := net.Dialer{Timeout: 30 * time.Second}
		if src != nil {
			d.LocalAddr = &net.TCPAddr{IP: src}
		}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		sc, chans, reqs, err := ssh.NewClientConn(nc, addr, cfg)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return ssh.NewClient(sc, chans, reqs), nil
	}
	if proxyAddr == "" {
		clt, err := dial(nodeAddr)
		if err != nil {
			return nil, err
		}
		return &hop{node: clt}, nil
	}
	proxy, err := dial(proxyAddr)
	if err != nil {
		return nil, err
	}
	conn, err := proxy.Dial("tcp", nodeAddr)
	if err != nil {
		proxy.Close()
		return nil, err
	}
	sconn, chans, reqs, err := ssh.NewClientConn(conn, nodeAddr, cfg)
	if err != nil {
		conn.Close()
		proxy.Close()
		return nil, err
	}
	return &hop{node: ssh.NewClient(sconn, chans, reqs), proxy: proxy}, nil
}

// path names the two ways to reach the node.
type path struct {
	name  string
	proxy func(c *cluster) string
}

var paths = []path{
	{"direct", func(*cluster) string { return "" }},
	{"via-proxy", func(c *cluster) string { return c.proxy }},
}

// cipherSets: the ciphers Postern offers by default (lib/sshalgo: AES-GCM
// only). aes128-gcm is x/crypto's first choice and what OpenSSH clients
// negotiate with Postern (chacha20-poly1305 and the CTR ciphers, which
// OpenSSH lists first, are not offered).
var cipherSets = []struct {
	name    string
	ciphers []string
}{
	{"aes128-gcm", []string{ssh.CipherAES128GCM}},
	{"aes256-gcm", []string{ssh.CipherAES256GCM}},
}

// writeCreds stores credentials for the helper process.
func writeCreds(dir string, cr credentials) error {
	var cas bytes.Buffer
	for _, ca := range cr.hostCAs {
		pk, err := ssh.ParsePublicKey(ca)
		if err != nil {
			return err
		}
		cas.Write(ssh.MarshalAuthorizedKey(pk))
	}
	for name, data := range map[string][]byte{"key": cr.keyPEM, "key-cert.pub": cr.certPub, "host_cas": cas.Bytes(), "login": []byte(cr.login)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func readCreds(dir string) (credentials, error) {
	var cr credentials
	var err error
	read := func(name string) []byte {
		if err != nil {
			return nil
		}
		var data []byte
		data, err = os.ReadFile(filepath.Join(dir, name))
		return data
	}
	cr.keyPEM, cr.certPub, cr.login = read("key"), read("key-cert.pub"), string(read("login"))
	cas := read("host_cas")
	if err != nil {
		return cr, err
	}
	for len(cas) > 0 {
		pk, _, _, rest, perr := ssh.ParseAuthorizedKey(cas)
		if perr != nil {
			break
		}
		cr.hostCAs = append(cr.hostCAs, pk.Marshal())
		cas = rest
	}
	return cr, nil
}
