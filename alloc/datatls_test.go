package alloc_test

import (
	"bytes"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/faultproxy"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
)

// TestDataPlaneTLS: a poold with control-plane TLS serves its rdma tier
// (loopback through its own data plane) over TLS. A recording proxy on
// the client's data-plane connections captures a write of a random
// pattern and its read-back: the capture starts with a TLS handshake and
// holds neither the credential, nor the segment key, nor any 16 bytes of
// the pattern; replaying the client's bytes gets no data-plane reply and
// changes nothing. With --data-insecure (the control) the same capture
// holds all three and the replay is accepted; status says which.
func TestDataPlaneTLS(t *testing.T) {
	for _, tc := range []struct {
		name     string
		insecure bool
		security string
	}{{"tls", false, "tls"}, {"data-insecure", true, "plaintext (--data-insecure)"}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pooltest.Config(t)
			cfg.Listen = "127.0.0.1:0"
			pooltest.TLS(t, &cfg)
			cfg.DataInsecure = tc.insecure
			cfg.LogLevel = "error" // the replay's refused handshake is expected
			pooltest.Start(t, cfg)

			conn, err := session.Channel("unix", cfg.Socket)
			require.NoError(t, err)
			defer conn.Close()
			st, err := poolv1.NewPoolClient(conn).Status(t.Context(), &poolv1.StatusRequest{})
			require.NoError(t, err)
			require.Equal(t, tc.security, st.DataSecurity)

			var rec faultproxy.Recording
			var home string
			through := func(addr string) string {
				p, err := faultproxy.Start(faultproxy.Config{Target: addr, Record: rec.Record})
				require.NoError(t, err)
				t.Cleanup(func() { p.Close() })
				home = addr
				return p.Addr()
			}
			c := dial(t, cfg.Socket, alloc.WithDataAddr(through))
			seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierRDMA))
			require.NoError(t, err)
			pattern := make([]byte, 256<<10)
			rand.Read(pattern)
			_, err = seg.WriteAt(pattern, 4096)
			require.NoError(t, err)
			got := make([]byte, len(pattern))
			_, err = seg.ReadAt(got, 4096)
			require.NoError(t, err)
			require.Equal(t, pattern, got)

			cred, key := alloc.DataSecrets(seg)
			require.NotEmpty(t, cred)
			sent, back := rec.Bytes()
			require.NotEmpty(t, sent, "the client's data plane did not go through the proxy")
			wire := append(sent, back...)
			patternSeen := false
			for off := 0; off+16 <= len(pattern); off += 4096 {
				patternSeen = patternSeen || bytes.Contains(wire, pattern[off:off+16])
			}
			plain := tc.insecure
			require.Equal(t, !plain, sent[0] == 0x16, "first byte %#x: a TLS handshake record is 0x16", sent[0])
			require.Equal(t, plain, bytes.Contains(wire, cred), "credential in the capture")
			require.Equal(t, plain, bytes.Contains(wire, key), "segment key in the capture")
			require.Equal(t, plain, patternSeen, "pattern in the capture")

			zero := make([]byte, len(pattern))
			_, err = seg.WriteAt(zero, 4096)
			require.NoError(t, err)
			replayed, err := faultproxy.Replay(home, sent, 2*time.Second)
			require.NoError(t, err)
			require.Equal(t, plain, bytes.HasPrefix(replayed, []byte("FMRD")), "the replay got a data-plane reply")
			if !plain {
				require.False(t, bytes.Contains(replayed, pattern[:16]), "the replay read data")
				_, err = seg.ReadAt(got, 4096)
				require.NoError(t, err)
				require.Equal(t, zero, got, "the replay wrote the segment")
			}
			require.NoError(t, seg.Free(t.Context()))
		})
	}
}
