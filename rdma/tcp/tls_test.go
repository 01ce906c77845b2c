package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/faultproxy"
)

// tlsConfigs returns a data-plane server's TLS configuration (a node
// certificate for "home", no client certificate asked) and a client's that
// verifies it against the test's CA under the name "home".
func tlsConfigs(tb testing.TB) (srv, cli *tls.Config) {
	tb.Helper()
	f := certs.ForTest(tb, "home", true)
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(tb, err)
	ca, err := os.ReadFile(f.CA)
	require.NoError(tb, err)
	roots := x509.NewCertPool()
	require.True(tb, roots.AppendCertsFromPEM(ca))
	srv = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13}
	cli = &tls.Config{RootCAs: roots, ServerName: "home", MinVersion: tls.VersionTLS13}
	return srv, cli
}

// overBoth runs fn in plaintext and over TLS, with the server
// configuration to start from and the client options that go with it.
func overBoth(t *testing.T, fn func(t *testing.T, cfg ServerConfig, opts []Option)) {
	srv, cli := tlsConfigs(t)
	t.Run("plaintext", func(t *testing.T) { fn(t, ServerConfig{}, nil) })
	t.Run("tls", func(t *testing.T) { fn(t, ServerConfig{TLS: srv}, []Option{WithTLS(cli)}) })
}

// TestTLSCaptureAndReplay: a recording proxy between a client and the
// data plane captures a write of a random pattern and its read-back. Over
// TLS the capture holds neither the credential, nor the segment's key, nor
// any 16 bytes of the pattern, and replaying the client's captured bytes
// to the server neither is accepted nor changes the segment. In plaintext
// (the control) all three are in the capture and the replay overwrites the
// segment, which shows the checks can fail.
func TestTLSCaptureAndReplay(t *testing.T) {
	srvTLS, cliTLS := tlsConfigs(t)
	for _, tc := range []struct {
		name   string
		secure bool
	}{{"tls", true}, {"plaintext", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cred := make([]byte, 16)
			rand.Read(cred)
			cfg := ServerConfig{Authenticate: func(c []byte) error {
				if !bytes.Equal(c, cred) {
					return errors.New("unknown credential")
				}
				return nil
			}}
			opts := []Option{WithCredential(cred), WithConns(1)}
			if tc.secure {
				cfg.TLS = srvTLS
				opts = append(opts, WithTLS(cliTLS))
			}
			s := startServer(t, cfg)
			mem, r := s.export(t, 7, 1<<20)
			var rec faultproxy.Recording
			p, err := faultproxy.Start(faultproxy.Config{Target: s.addr, Record: rec.Record})
			require.NoError(t, err)
			t.Cleanup(func() { p.Close() })

			pattern := make([]byte, 256<<10)
			rand.Read(pattern)
			c := dial(t, p.Addr(), opts...)
			ctx := t.Context()
			require.NoError(t, c.Write(ctx, r, 4096, pattern))
			got := make([]byte, len(pattern))
			require.NoError(t, c.Read(ctx, r, 4096, got))
			require.Equal(t, pattern, got)
			require.NoError(t, c.Close())

			sent, back := rec.Bytes()
			wire := append(sent, back...)
			found := func(b []byte) bool { return bytes.Contains(wire, b) }
			patternSeen := false
			for off := 0; off+16 <= len(pattern); off += 4096 {
				patternSeen = patternSeen || found(pattern[off:off+16])
			}
			require.Equal(t, !tc.secure, found(cred), "credential in the capture")
			require.Equal(t, !tc.secure, found(r.Key[:]), "segment key in the capture")
			require.Equal(t, !tc.secure, patternSeen, "pattern in the capture")

			// The victim's data changes after the capture; a replay of the
			// client's bytes must not write the old pattern back.
			clear(mem[4096 : 4096+len(pattern)])
			replayed, err := faultproxy.Replay(s.addr, sent, 2*time.Second)
			require.NoError(t, err)
			restored := bytes.Equal(mem[4096:4096+len(pattern)], pattern)
			require.Equal(t, !tc.secure, restored, "replay rewrote the segment")
			if tc.secure {
				require.False(t, bytes.Contains(replayed, magic[:]), "the replay got a data-plane reply")
				require.False(t, bytes.Contains(replayed, pattern[:16]), "the replay read data")
			}
		})
	}
}

// TestTLSRefusesUnverifiedServer: a client whose TLS configuration does not
// accept the server's certificate (another server name) fails to dial
// with an error that says TLS, and a plaintext client is not accepted by a
// TLS server.
func TestTLSRefusesUnverifiedServer(t *testing.T) {
	srvTLS, cliTLS := tlsConfigs(t)
	s := startServer(t, ServerConfig{TLS: srvTLS})
	wrong := cliTLS.Clone()
	wrong.ServerName = "elsewhere"
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := Dial(ctx, s.addr, WithTLS(wrong), WithConns(1))
	require.ErrorContains(t, err, "TLS handshake")
	_, err = Dial(ctx, s.addr, WithConns(1))
	require.Error(t, err)

	// The right configuration works, busy polling under TLS included.
	_, r := s.export(t, 1, 1<<16)
	c := dial(t, s.addr, WithTLS(cliTLS), WithBusyPoll(DefaultBusyPoll))
	buf := []byte("over tls")
	require.NoError(t, c.Write(ctx, r, 8, buf))
	got := make([]byte, len(buf))
	require.NoError(t, c.Read(ctx, r, 8, got))
	require.Equal(t, buf, got)
	_, err = c.FetchAdd64(ctx, r, 0, 1)
	require.NoError(t, err)
}
