package pool_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/pool"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// client is a session with a daemon, as a malicious program would hold
// one: the raw control plane and the data-plane credential.
type client struct {
	s   *session.Conn
	api poolv1.PoolClient
}

func dialSession(t *testing.T, network, addr, id string, tc *tls.Config) (*client, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := session.Dial(ctx, network, addr, session.Options{ClientID: id, TLS: tc})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { s.Close() })
	return &client{s: s, api: s.API()}, nil
}

func (c *client) ctx(t *testing.T) context.Context {
	ctx, _, err := c.s.Call(t.Context())
	require.NoError(t, err)
	return ctx
}

func (c *client) alloc(t *testing.T, req *poolv1.AllocRequest) (*poolv1.Segment, error) {
	seg, err := c.api.Alloc(c.ctx(t), req)
	return seg, errs.FromStatus(err)
}

// data dials the data plane of seg's home with cred, over TLS when seg
// says its home serves TLS.
func data(t *testing.T, seg *poolv1.Segment, cred []byte) (*tcp.Client, error) {
	opts := []tcp.Option{tcp.WithCredential(cred)}
	if seg.DataTls {
		tc, err := certs.Verifier(seg.DataTlsCa, seg.DataServerName)
		require.NoError(t, err)
		opts = append(opts, tcp.WithTLS(tc))
	}
	dc, err := tcp.Dial(t.Context(), seg.DataAddr, opts...)
	if err == nil {
		t.Cleanup(func() { dc.Close() })
	}
	return dc, err
}

func region(seg *poolv1.Segment) rdma.Region {
	var k rdma.Key
	copy(k[:], seg.Key)
	return rdma.Region{Segment: seg.HomeId, Key: k, Epoch: seg.Epoch}
}

// TestMaliciousClient: a client with a session of its own guesses segment
// ids, keys and offsets, replays a revoked key, uses another client's key
// and presents wrong credentials. Every attempt is refused with its typed
// error, the victim's bytes are unchanged, and the daemon keeps serving.
func TestMaliciousClient(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	victim, err := dialSession(t, "unix", cfg.Socket, "victim", nil)
	require.NoError(t, err)
	mallory, err := dialSession(t, "unix", cfg.Socket, "mallory", nil)
	require.NoError(t, err)

	const n = 64 << 10
	vseg, err := victim.alloc(t, &poolv1.AllocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	require.Len(t, vseg.DataCredential, 16, "a session's rdma segment comes with its data-plane credential")
	vdc, err := data(t, vseg, vseg.DataCredential)
	require.NoError(t, err)
	want := make([]byte, n)
	rand.Read(want)
	require.NoError(t, vdc.Write(t.Context(), region(vseg), 0, want))

	mseg, err := mallory.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	mdc, err := data(t, mseg, mseg.DataCredential)
	require.NoError(t, err)
	own := region(mseg)

	t.Run("control plane hides and guards the victim's segment", func(t *testing.T) {
		_, err := mallory.api.Stat(mallory.ctx(t), &poolv1.StatRequest{Id: vseg.Id})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied, "Stat tells nothing of a segment the client may not open")
		list, err := mallory.api.List(mallory.ctx(t), &poolv1.ListRequest{})
		require.NoError(t, err)
		for _, s := range list.Segments {
			require.NotEqual(t, vseg.Id, s.Id, "List hides another client's unnamed segment")
		}
		_, err = mallory.api.Free(mallory.ctx(t), &poolv1.FreeRequest{Id: vseg.Id})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
	})

	buf := make([]byte, 64)
	denied := func(t *testing.T, r rdma.Region, off int64) {
		t.Helper()
		require.ErrorIs(t, mdc.Read(t.Context(), r, off, buf), rdma.ErrAccessDenied)
		require.ErrorIs(t, mdc.Write(t.Context(), r, off, buf), rdma.ErrAccessDenied)
		_, err := mdc.FetchAdd64(t.Context(), r, 0, 1)
		require.ErrorIs(t, err, rdma.ErrAccessDenied)
		_, _, err = mdc.CompareAndSwap64(t.Context(), r, 0, 0, 1)
		require.ErrorIs(t, err, rdma.ErrAccessDenied)
	}
	t.Run("guessed keys", func(t *testing.T) {
		for range 64 {
			var k rdma.Key
			rand.Read(k[:])
			denied(t, rdma.Region{Segment: vseg.HomeId, Key: k, Epoch: vseg.Epoch}, 0)
		}
	})
	t.Run("own key on other ids", func(t *testing.T) {
		for _, id := range []uint64{vseg.HomeId, mseg.HomeId - 1, mseg.HomeId + 1, mseg.HomeId + 2, 0, 1 << 63} {
			if id == mseg.HomeId {
				continue
			}
			denied(t, rdma.Region{Segment: id, Key: own.Key, Epoch: own.Epoch}, 0)
		}
	})
	t.Run("victim key with flipped bits", func(t *testing.T) {
		for i := range 16 {
			r := region(vseg)
			r.Key[i] ^= 1
			denied(t, r, 0)
		}
	})
	t.Run("out of range", func(t *testing.T) {
		for _, tc := range []struct {
			off int64
			n   int
		}{{4096, 1}, {4090, 8}, {1 << 40, 8}, {1<<63 - 1, 8}, {0, 4097}, {0, 1 << 20}} {
			p := make([]byte, tc.n)
			require.ErrorIs(t, mdc.Read(t.Context(), own, tc.off, p), rdma.ErrOutOfRange, "read %d at %d", tc.n, tc.off)
			require.ErrorIs(t, mdc.Write(t.Context(), own, tc.off, p), rdma.ErrOutOfRange, "write %d at %d", tc.n, tc.off)
		}
		_, err := mdc.FetchAdd64(t.Context(), own, 4096, 1)
		require.ErrorIs(t, err, rdma.ErrOutOfRange)
	})
	t.Run("revoked key, and a fresh key after reuse", func(t *testing.T) {
		_, err := mallory.api.Free(mallory.ctx(t), &poolv1.FreeRequest{Id: mseg.Id})
		require.NoError(t, err)
		err = mdc.Write(t.Context(), own, 0, buf)
		require.True(t, errors.Is(err, rdma.ErrLeaseExpired) || errors.Is(err, rdma.ErrAccessDenied), "a freed segment's key is refused: %v", err)
		again, err := mallory.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA})
		require.NoError(t, err)
		require.Equal(t, mseg.Offset, again.Offset, "the freed extent is reused")
		require.NotEqual(t, mseg.Key, again.Key, "a new segment on reused memory has a new key")
		denied(t, rdma.Region{Segment: again.HomeId, Key: own.Key, Epoch: again.Epoch}, 0)
	})
	t.Run("wrong data-plane credentials", func(t *testing.T) {
		junk := make([]byte, 16)
		rand.Read(junk)
		for name, cred := range map[string][]byte{"none": nil, "random": junk, "short": junk[:8], "the segment key": vseg.Key} {
			_, err := data(t, vseg, cred)
			require.ErrorIs(t, err, rdma.ErrAccessDenied, name)
		}
		gone, err := dialSession(t, "unix", cfg.Socket, "short-lived", nil)
		require.NoError(t, err)
		cred := gone.s.DataCredential()
		_, err = data(t, vseg, cred)
		require.NoError(t, err, "a live session's credential is accepted")
		require.NoError(t, gone.s.Close())
		require.Eventually(t, func() bool {
			_, err := data(t, vseg, cred)
			return errors.Is(err, rdma.ErrAccessDenied)
		}, 10*time.Second, 10*time.Millisecond, "an ended session's credential is refused")
	})

	got := make([]byte, n)
	require.NoError(t, vdc.Read(t.Context(), region(vseg), 0, got))
	require.Equal(t, want, got, "the victim's bytes are untouched")
	late, err := dialSession(t, "unix", cfg.Socket, "late", nil)
	require.NoError(t, err, "the daemon keeps serving")
	_, err = late.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL})
	require.NoError(t, err)
}

// peerCredHelperEnv makes TestPeerCredHelper dial the socket it names.
const peerCredHelperEnv = "FARMEM_TEST_DIAL_SOCKET"

// TestPeerCredHelper is not a test on its own: TestUnixSocketAllowList runs
// the test binary as another uid with it, to dial the daemon's socket.
func TestPeerCredHelper(t *testing.T) {
	sock := os.Getenv(peerCredHelperEnv)
	if sock == "" {
		t.Skip("helper process of TestUnixSocketAllowList")
	}
	_, err := dialSession(t, "unix", sock, "helper", nil)
	fmt.Printf("uid %d: %v\n", os.Getuid(), err)
	if err == nil {
		t.Fatal("accepted")
	}
}

// TestUnixSocketAllowList: a process of a uid outside the allow list is
// refused on the unix socket (checked with SO_PEERCRED), one inside it is
// served.
func TestUnixSocketAllowList(t *testing.T) {
	t.Run("own uid not listed", func(t *testing.T) {
		cfg := pooltest.Config(t)
		cfg.AllowUIDs = pool.IDList{uint32(os.Getuid()) + 4242}
		pooltest.Start(t, cfg)
		_, err := dialSession(t, "unix", cfg.Socket, "x", nil)
		require.Error(t, err)
		cfg2 := pooltest.Config(t)
		cfg2.AllowUIDs = pool.IDList{uint32(os.Getuid()) + 4242}
		cfg2.AllowGIDs = pool.IDList{uint32(os.Getgid())}
		pooltest.Start(t, cfg2)
		_, err = dialSession(t, "unix", cfg2.Socket, "x", nil)
		require.NoError(t, err, "a listed gid is enough")
	})
	t.Run("another uid", func(t *testing.T) {
		if os.Getuid() != 0 {
			t.Skip("needs root to run a process as nobody")
		}
		cfg := pooltest.Config(t)
		pooltest.Start(t, cfg)
		out, err := runAsNobody(t, cfg.Socket, "TestPeerCredHelper", peerCredHelperEnv)
		require.NoError(t, err, "%s", out)
		require.Contains(t, out, "uid 65534: ")
		require.NotContains(t, out, "uid 65534: <nil>")
	})
}

// runAsNobody runs one test of a copy of the test binary as uid and gid
// 65534 (nobody), with env set to socket, and returns its output. The
// caller must be root.
func runAsNobody(t *testing.T, socket, test, env string) (string, error) {
	// nobody must reach the socket file for SO_PEERCRED to decide: the
	// test's directory is root's, the socket is poold's, 0666.
	require.NoError(t, os.Chmod(filepath.Dir(socket), 0o755))
	fi, err := os.Stat(socket)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o666), fi.Mode().Perm(), "the allow list decides who is served, not the socket's mode")
	// The test binary lives in a directory only root may enter: nobody
	// runs a copy.
	self, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	bin, err := os.ReadFile(self)
	require.NoError(t, err)
	exe := filepath.Join(dir, "helper.test")
	require.NoError(t, os.WriteFile(exe, bin, 0o755))
	cmd := exec.CommandContext(t.Context(), exe, "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+socket, "TMPDIR="+dir, "HOME="+dir, "GOCOVERDIR="+dir)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestQuotas: an identity's allocations stop at its quota with
// ErrNoCapacity naming it; a fallback tier without a quota still serves;
// Status shows usage beside quota; freeing makes room again.
func TestQuotas(t *testing.T) {
	cfg := pooltest.Config(t)
	require.NoError(t, cfg.Quotas.Set("default/CXL=1MiB")) // tier names in any letter case, printed in lower case
	ident := "uid:" + strconv.Itoa(os.Getuid())
	require.NoError(t, cfg.Quotas.Set(ident+"/local=2MiB"))
	cfg.Metrics = "127.0.0.1:0"
	d := pooltest.Start(t, cfg)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	defer c.Close()

	a, err := c.Alloc(ctx, 768<<10, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	_, err = c.Alloc(ctx, 512<<10, alloc.WithTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrNoCapacity)
	require.ErrorContains(t, err, "quota of "+ident+" (quotas.default.cxl = 1.0 MiB)")
	require.ErrorContains(t, err, "--quota default/cxl=SIZE")
	// Another client of the same identity shares the quota.
	c2, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Alloc(ctx, 512<<10, alloc.WithTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrNoCapacity)
	fb, err := c.Alloc(ctx, 512<<10, alloc.WithTier(alloc.TierCXL), alloc.WithFallback(alloc.TierRDMA))
	require.NoError(t, err, "the fallback tier has no quota")
	require.Equal(t, alloc.TierRDMA, fb.Tier())
	_, err = c.Alloc(ctx, 3<<20, alloc.WithTier(alloc.TierLocal))
	require.ErrorContains(t, err, "quotas."+ident+".local")

	st := status(t, cfg.Socket)
	var found bool
	for _, q := range st.Quotas {
		if q.Identity == ident && q.Tier == poolv1.Tier_TIER_CXL {
			found = true
			require.EqualValues(t, 768<<10, q.UsedBytes)
			require.EqualValues(t, 1<<20, q.QuotaBytes)
		}
	}
	require.True(t, found, "status lists %s's cxl usage: %v", ident, st.Quotas)
	code, body, err := httpGet(t, "http://"+d.MetricsAddr()+"/metrics")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Contains(t, body, `farmem_quota_used_bytes{identity="`+ident+`",tier="cxl"} 786432`)
	require.Contains(t, body, `farmem_quota_bytes{identity="`+ident+`",tier="cxl"} 1.048576e+06`)

	require.NoError(t, a.Free(ctx))
	_, err = c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err, "a free makes room under the quota again")
}

// TestLimits: the per-client segment limit and the name length limit fail
// with ErrLimit naming the setting; configuration out of range is refused.
func TestLimits(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.MaxSegmentsPerClient = 3
	cfg.MaxNameLen = 8
	pooltest.Start(t, cfg)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	defer c.Close()
	var segs []*alloc.Segment
	for range 3 {
		s, err := c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL))
		require.NoError(t, err)
		segs = append(segs, s)
	}
	_, err = c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrLimit)
	require.ErrorContains(t, err, "max-segments-per-client 3")
	require.NoError(t, segs[0].Free(ctx))
	_, err = c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)

	_, err = c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL), alloc.WithName("nine-long"))
	require.ErrorIs(t, err, alloc.ErrLimit)
	require.ErrorContains(t, err, "max-name-len 8")

	for _, tc := range []struct {
		name string
		set  func(*pool.Config)
		want string
	}{
		{"negative segments", func(c *pool.Config) { c.MaxSegmentsPerClient = -1 }, "max-segments-per-client"},
		{"name length", func(c *pool.Config) { c.MaxNameLen = 256 }, "max-name-len"},
		{"in flight", func(c *pool.Config) { c.DataMaxInflight = 0 }, "data-max-inflight"},
		{"in flight high", func(c *pool.Config) { c.DataMaxInflight = 5000 }, "data-max-inflight"},
		{"busy poll negative", func(c *pool.Config) { c.DataBusyPoll = -time.Microsecond }, "data-busy-poll"},
		{"busy poll long", func(c *pool.Config) { c.DataBusyPoll = 2 * time.Millisecond }, "data-busy-poll"},
		{"max conns", func(c *pool.Config) { c.DataMaxConns = 0 }, "data-max-conns"},
		{"handshakes", func(c *pool.Config) { c.DataMaxHandshakes = 0 }, "data-max-handshakes"},
		{"handshakes over conns", func(c *pool.Config) { c.DataMaxHandshakes = c.DataMaxConns + 1 }, "data-max-handshakes"},
		{"handshakes per source", func(c *pool.Config) { c.DataMaxHandshakesPerSource = 0 }, "data-max-handshakes-per-source"},
		{"per source over all", func(c *pool.Config) { c.DataMaxHandshakesPerSource = c.DataMaxHandshakes + 1 }, "data-max-handshakes-per-source"},
		{"per tenant negative", func(c *pool.Config) { c.DataMaxConnsPerTenant = -1 }, "data-max-conns-per-tenant"},
		{"per tenant over all", func(c *pool.Config) { c.DataMaxConnsPerTenant = c.DataMaxConns + 1 }, "data-max-conns-per-tenant"},
		{"frame timeout", func(c *pool.Config) { c.DataFrameTimeout = 0 }, "data-frame-timeout"},
		{"no one allowed", func(c *pool.Config) { c.AllowUIDs = nil }, "allow-uids"},
		{"listen without tls", func(c *pool.Config) { c.Listen = "127.0.0.1:0" }, "mutual TLS"},
		{"half tls", func(c *pool.Config) { c.Listen, c.TLSCert = "127.0.0.1:0", "x.crt" }, "tls-key"},
		{"quota tier", func(c *pool.Config) { c.Quotas = pool.Quotas{"default": {"disk": 1}} }, `unknown tier "disk"; use local, cxl or rdma`},
		{"quota any tier", func(c *pool.Config) { c.Quotas = pool.Quotas{"default": {"any": 1}} }, `unknown tier "any"`},
		{"quota tier twice", func(c *pool.Config) { c.Quotas = pool.Quotas{"default": {"cxl": 1, "CXL": 2}} }, `"CXL" and "cxl" name the same tier`},
		{"quota size", func(c *pool.Config) { c.Quotas = pool.Quotas{"default": {"cxl": 0}} }, "positive size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pooltest.Config(t)
			tc.set(&c)
			err := c.Validate()
			require.ErrorIs(t, err, pool.ErrConfig)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestTLSControlPlane: the TCP control plane serves clients with a
// certificate of its CA, under their certificate's identity; it refuses
// plaintext, certificates of another CA, and a client id that belongs to
// another identity.
func TestTLSControlPlane(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	d := pooltest.Start(t, cfg)
	addr := d.ListenAddr()

	app, err := dialSession(t, "tcp", addr, "app-1", pooltest.ClientTLS(t, "app"))
	require.NoError(t, err)
	seg, err := app.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	dc, err := data(t, seg, seg.DataCredential)
	require.NoError(t, err)
	require.NoError(t, dc.Write(t.Context(), region(seg), 0, []byte("hello")))

	var ident string
	for _, ci := range status(t, cfg.Socket).Clients {
		if ci.Id == "app-1" {
			ident = ci.Identity
		}
	}
	require.Equal(t, "cn:app", ident)

	_, err = dialSession(t, "tcp", addr, "app-1", pooltest.ClientTLS(t, "mallory"))
	require.ErrorIs(t, err, errs.ErrAccessDenied, "another identity cannot take over app-1")
	_, err = dialSession(t, "tcp", addr, "poold/test-node", pooltest.ClientTLS(t, "mallory"))
	require.ErrorIs(t, err, errs.ErrAccessDenied, "a peer's client id needs that node's certificate")

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = session.Dial(ctx, "tcp", addr, session.Options{ClientID: "plain"})
	require.Error(t, err, "plaintext is refused")

	other := pooltest.Config(t) // a second test's CA: not trusted
	stranger := t
	t.Run("another CA", func(t *testing.T) {
		_ = other
		tc := pooltest.ClientTLS(t, "stranger") // t is a subtest: a CA of its own
		tc.RootCAs = pooltest.ClientTLS(stranger, "x").RootCAs
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := session.Dial(ctx, "tcp", addr, session.Options{ClientID: "stranger", TLS: tc})
		require.Error(t, err)
	})
}
