package proxy

import (
	"testing"

	"github.com/gravitational/trace"
	"github.com/stretchr/testify/require"
)

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Target
	}{
		{"web", Target{Host: "web"}},
		{"web:3022", Target{Host: "web", Port: "3022"}},
		{"web:022", Target{Host: "web", Port: "22"}},
		{"web.c1:0", Target{Host: "web.c1", Port: "0"}},
		{"10.0.0.1:22", Target{Host: "10.0.0.1", Port: "22"}},
		{"[2001:db8::1]:3022", Target{Host: "2001:db8::1", Port: "3022"}},
		{"[::1]", Target{Host: "::1"}},
		{"2001:db8::1", Target{Host: "2001:db8::1"}},
		{"fe80::1%eth0", Target{Host: "fe80::1%eth0"}},
		{"5f3c9a2e-1b7d-4c1e-9f0a-2b3c4d5e6f70", Target{Host: "5f3c9a2e-1b7d-4c1e-9f0a-2b3c4d5e6f70"}},
	} {
		got, err := ParseTarget(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
	}
	for _, bad := range []string{"", ":22", "web:", "web:x", "web:65536", "web:-1", "a b", "a/b", "u@h", "[web]:22",
		"[::1", "[::1]x", "[::1]:", "1:2:3", "web:22:33", "\x00", "web\n"} {
		_, err := ParseTarget(bad)
		require.True(t, trace.IsBadParameter(err), "%q: %v", bad, err)
	}
}

func TestParseProxySubsystem(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Target
	}{
		{"proxy:web:3022", Target{Host: "web", Port: "3022"}},
		{"proxy:web:22@c1", Target{Host: "web", Port: "22", Cluster: "c1"}},
		{"proxy:web:0@c1", Target{Host: "web", Port: "0", Cluster: "c1"}},
		{"proxy:[2001:db8::1]:3022@c1", Target{Host: "2001:db8::1", Port: "3022", Cluster: "c1"}},
		{"proxy:[::1]:22", Target{Host: "::1", Port: "22"}},
		{"proxy:web", Target{Host: "web"}},
		{"proxy:10.0.0.1:3022", Target{Host: "10.0.0.1", Port: "3022"}},
		{"proxy:web.c1", Target{Host: "web.c1"}},
	} {
		got, err := ParseProxySubsystem(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.in, got.SubsystemString(), "render")
	}
	for _, bad := range []string{"", "proxy", "proxy:", "sftp", "proxysites", "Proxy:web:22", "proxy:web@c1",
		"proxy:web:22@", "proxy:web:22@c/1", "proxy:web:22@c1@c2", "proxy:::1", "proxy:2001:db8::1:22",
		"proxy:[::1]", "proxy:[::1]@c1", "proxy:[web]:22", "proxy:web:", "proxy:web:port", "proxy:web:99999",
		"proxy::22", "proxy: web:22", "proxy:web:22 ", "proxy:w b:22"} {
		_, err := ParseProxySubsystem(bad)
		require.True(t, trace.IsBadParameter(err), "%q: %v", bad, err)
		require.EqualError(t, err, `invalid proxy subsystem request "`+bad+`": expected proxy:host:port[@cluster]`)
	}
	// Non-printable input is escaped; huge input is cut short.
	_, err := ParseProxySubsystem("proxy:\x01")
	require.EqualError(t, err, `invalid proxy subsystem request "proxy:\x01": expected proxy:host:port[@cluster]`)
	long := "proxy:" + string(make([]byte, 5000))
	_, err = ParseProxySubsystem(long)
	require.Less(t, len(err.Error()), 1200)
}

func TestTargetString(t *testing.T) {
	require.Equal(t, "web", Target{Host: "web"}.String())
	require.Equal(t, "[::1]:22@c1", Target{Host: "::1", Port: "22", Cluster: "c1"}.String())
	require.Equal(t, "proxy:web:0@c1", Target{Host: "web", Cluster: "c1"}.SubsystemString())
}

func FuzzParseProxySubsystem(f *testing.F) {
	for _, s := range []string{"proxy:web:3022", "proxy:web:22@c1", "proxy:[2001:db8::1]:3022@c1", "proxy:web",
		"proxy:[::1]", "proxy:a:b:c", "proxysites", "proxy:web:0@c.1-x_y", "proxy:[fe80::1%eth0]:22"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tgt, err := ParseProxySubsystem(s)
		if err != nil {
			require.True(t, trace.IsBadParameter(err))
			require.Equal(t, Target{}, tgt)
			return
		}
		require.NotEmpty(t, tgt.Host)
		again, err := ParseProxySubsystem(tgt.SubsystemString())
		require.NoError(t, err, "re-parse of %q", tgt.SubsystemString())
		require.Equal(t, tgt, again)
		// The same host:port parses the same way as a plain target.
		if tgt.Port != "" {
			pt, err := ParseTarget(Target{Host: tgt.Host, Port: tgt.Port}.String())
			require.NoError(t, err)
			require.Equal(t, Target{Host: tgt.Host, Port: tgt.Port}, pt)
		}
	})
}
