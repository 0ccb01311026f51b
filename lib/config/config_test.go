package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"

	"github.com/postern-dev/postern/lib/sshalgo"
)

func TestSampleConfigParses(t *testing.T) {
	fc, err := ReadFile(filepath.Join("..", "..", "fixtures", "postern.yaml"))
	require.NoError(t, err)
	require.Equal(t, "example", fc.ClusterName)
	require.Equal(t, map[string]string{"env": "staging", "team": "infra"}, fc.Labels)
	cfg := Config{FileConfig: *fc}
	require.NoError(t, cfg.CheckAndSetDefaults())
	require.Equal(t, BackendSQLite, cfg.Backend.Type)
	require.True(t, cfg.HasRole(RoleNode))
}

func TestBrokenFilesNameFileAndLine(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown key", "cluster_name: a\nnot_a_key: 1\n", "line 2: field not_a_key not found"},
		{"wrong type", "labels: [a, b]\n", "line 1:"},
		{"broken syntax", "roles: [auth\n", "line"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "postern.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.yaml), 0o600))
			_, err := ReadFile(path)
			require.Error(t, err)
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.Contains(t, err.Error(), path)
			require.Contains(t, err.Error(), tc.want)
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestEmptyFileIsValid(t *testing.T) {
	fc, err := Parse(nil)
	require.NoError(t, err)
	require.Empty(t, fc.ClusterName)
}

func TestCheckAndSetDefaults(t *testing.T) {
	cfg := Config{}
	require.NoError(t, cfg.CheckAndSetDefaults())
	require.Equal(t, DefaultDataDir, cfg.DataDir)
	require.Equal(t, []string{RoleAuth, RoleProxy, RoleNode}, cfg.Roles)
	require.Equal(t, DefaultDiagAddr, cfg.DiagAddr)

	bad := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown role", Config{FileConfig: FileConfig{Roles: []string{"db"}}}, `unknown role "db"`},
		{"node without auth", Config{FileConfig: FileConfig{Roles: []string{RoleNode}}}, "--auth-server"},
		{"bad addr", Config{FileConfig: FileConfig{SSHAddr: "nope"}}, "ssh_addr"},
		{"bad pin", Config{FileConfig: FileConfig{CAPin: "md5:x"}}, "ca_pin"},
		{"half web tls", Config{FileConfig: FileConfig{WebCert: "a"}}, "web_cert"},
		{"etcd without endpoints", Config{FileConfig: FileConfig{Backend: BackendConfig{Type: BackendEtcd}}}, "etcd_endpoints"},
		{"unknown backend", Config{FileConfig: FileConfig{Backend: BackendConfig{Type: "mysql"}}}, `unknown backend "mysql"`},
		{"log format", Config{FileConfig: FileConfig{LogFormat: "xml"}}, "log format"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.CheckAndSetDefaults()
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestParseLabels(t *testing.T) {
	l, err := ParseLabels("env=prod, team=db")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"env": "prod", "team": "db"}, l)
	_, err = ParseLabels("env")
	require.Error(t, err)
	_, err = ParseLabels("=x")
	require.Error(t, err)
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("cluster_name: a\nroles: [auth]\n"))
	f.Add([]byte("labels: {a: b}\nlimits: {idle_timeout: 5m}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fc, err := Parse(data)
		if err == nil && fc == nil {
			t.Fatal("nil config without error")
		}
	})
}

// TestDiagPprofNeedsLoopback: profiles are for the operator on the host,
// never the network; a non-loopback diag_addr with diag_pprof is refused.
func TestDiagPprofNeedsLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:3000", true},
		{"[::1]:3000", true},
		{"localhost:3000", true},
		{"0.0.0.0:3000", false},
		{"10.1.2.3:3000", false},
		{":3000", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			cfg := Config{FileConfig: FileConfig{DataDir: t.TempDir(), NodeName: "n", DiagAddr: tc.addr, DiagPprof: true}}
			err := cfg.CheckAndSetDefaults()
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.Contains(t, err.Error(), "diag_pprof")
			require.Contains(t, err.Error(), "loopback")
		})
	}
	// Without diag_pprof any address is fine.
	cfg := Config{FileConfig: FileConfig{DataDir: t.TempDir(), NodeName: "n", DiagAddr: "0.0.0.0:3000"}}
	require.NoError(t, cfg.CheckAndSetDefaults())
}

func TestGCPercentRange(t *testing.T) {
	for _, tc := range []struct {
		pct int
		ok  bool
	}{{0, true}, {10, true}, {400, true}, {10000, true}, {9, false}, {-1, false}, {10001, false}} {
		cfg := Config{FileConfig: FileConfig{DataDir: t.TempDir(), NodeName: "n", GCPercent: tc.pct}}
		err := cfg.CheckAndSetDefaults()
		if tc.ok {
			require.NoError(t, err, tc.pct)
			continue
		}
		require.True(t, trace.IsBadParameter(err), "%d: %v", tc.pct, err)
		require.Contains(t, err.Error(), "gc_percent")
	}
}

func TestEtcdTLS(t *testing.T) {
	fc, err := Parse([]byte("backend:\n  type: etcd\n  etcd_endpoints: [https://e1:2379, https://e2:2379]\n  etcd_tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem}\n"))
	require.NoError(t, err)
	cfg := Config{FileConfig: *fc}
	require.NoError(t, cfg.CheckAndSetDefaults())
	require.Equal(t, &EtcdTLS{CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem"}, cfg.Backend.EtcdTLS)

	_, err = Parse([]byte("backend:\n  etcd_tls: {ca_file: /ca.pem, cert: /c.pem}\n"))
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), "field cert not found")

	for _, tc := range []struct{ yaml, want string }{
		{"etcd_endpoints: [http://e1:2379]\n  etcd_tls: {ca_file: /ca.pem}", "must be https://"},
		{"etcd_endpoints: [https://e1:2379]", "set backend.etcd_tls"},
		{"etcd_endpoints: [https://e1:2379]\n  etcd_tls: {cert_file: /c.pem, key_file: /k.pem}", "missing ca_file"},
		{"etcd_endpoints: [https://e1:2379]\n  etcd_tls: {ca_file: /ca.pem, cert_file: /c.pem}", "cert_file and key_file go together"},
		{"etcd_endpoints: [e1:2379]", "want http://HOST:PORT"},
	} {
		fc, err := Parse([]byte("backend:\n  type: etcd\n  " + tc.yaml + "\n"))
		require.NoError(t, err, tc.yaml)
		cfg := Config{FileConfig: *fc}
		err = cfg.CheckAndSetDefaults()
		require.True(t, trace.IsBadParameter(err), "%s: %v", tc.yaml, err)
		require.Contains(t, err.Error(), tc.want)
	}
}

func TestAuthServerList(t *testing.T) {
	cfg := Config{FileConfig: FileConfig{Roles: []string{RoleNode}, AuthServer: "a:3025, b:3025,"}}
	require.NoError(t, cfg.CheckAndSetDefaults())
	require.Equal(t, []string{"a:3025", "b:3025"}, cfg.AuthServers())
	cfg = Config{FileConfig: FileConfig{Roles: []string{RoleNode}, AuthServer: "a:3025,b"}}
	err := cfg.CheckAndSetDefaults()
	require.True(t, trace.IsBadParameter(err), "%v", err)
	require.Contains(t, err.Error(), `"b"`)
}

// TestCheckAndSetDefaultsTwice: a config goes through CheckAndSetDefaults
// in tool/postern and again in service.New; the second pass must change
// nothing, DiagAddrDefaulted included (a second node on one machine relies
// on it to start without diagnostics instead of failing).
func TestCheckAndSetDefaultsTwice(t *testing.T) {
	for _, diag := range []string{"", "127.0.0.1:3999"} {
		cfg := Config{FileConfig: FileConfig{DiagAddr: diag}}
		require.NoError(t, cfg.CheckAndSetDefaults())
		once := cfg
		require.NoError(t, cfg.CheckAndSetDefaults())
		require.Equal(t, once, cfg)
		require.Equal(t, diag == "", cfg.DiagAddrDefaulted, "diag_addr %q", diag)
	}
}

// TestSSHAlgorithms: the three lists parse from the file, an unset one
// is the default, and a name that is unknown, unsupported or insecure is
// refused naming the key and the value.
func TestSSHAlgorithms(t *testing.T) {
	fc, err := Parse([]byte("ssh_kex_algorithms: [curve25519-sha256]\nssh_ciphers:\n  - aes256-gcm@openssh.com\n  - aes256-ctr\n"))
	require.NoError(t, err)
	cfg := Config{FileConfig: *fc}
	require.NoError(t, cfg.CheckAndSetDefaults())
	got := cfg.SSHAlgorithms()
	require.Equal(t, []string{"curve25519-sha256"}, got.KeyExchanges)
	require.Equal(t, []string{"aes256-gcm@openssh.com", "aes256-ctr"}, got.Ciphers)
	require.Equal(t, []string{"hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com"}, got.MACs, "unset: the default")

	require.Equal(t, sshalgo.Defaults(), (&Config{}).SSHAlgorithms())

	for _, tc := range []struct {
		yaml, want string
	}{
		{"ssh_kex_algorithms: [curve25519-sha256, curve25519-sha512]", `ssh_kex_algorithms: unknown or unsupported key exchange "curve25519-sha512": want some of`},
		{"ssh_kex_algorithms: [diffie-hellman-group1-sha1]", `ssh_kex_algorithms: key exchange "diffie-hellman-group1-sha1" is insecure and not accepted`},
		{"ssh_ciphers: [arcfour256]", `ssh_ciphers: cipher "arcfour256" is insecure and not accepted`},
		{"ssh_ciphers: [aes128-gcm@openssh.com, aes-gcm]", `ssh_ciphers: unknown or unsupported cipher "aes-gcm"`},
		{"ssh_macs: [hmac-sha1-96]", `ssh_macs: MAC "hmac-sha1-96" is insecure and not accepted`},
		{"ssh_macs: [umac-128-etm@openssh.com]", `ssh_macs: unknown or unsupported MAC "umac-128-etm@openssh.com"`},
	} {
		t.Run(tc.yaml, func(t *testing.T) {
			fc, err := Parse([]byte(tc.yaml))
			require.NoError(t, err)
			cfg := Config{FileConfig: *fc}
			err = cfg.CheckAndSetDefaults()
			require.True(t, trace.IsBadParameter(err), "%v", err)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "\n")
		})
	}
}
