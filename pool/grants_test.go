package pool_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/pool"
)

// names lists the names of the segments a List answers.
func names(t *testing.T, resp *poolv1.ListResponse, err error) []string {
	t.Helper()
	require.NoError(t, err)
	var out []string
	for _, s := range resp.Segments {
		if s.Name != "" {
			out = append(out, s.Name)
		}
	}
	return out
}

// adminAPI is the control plane without a session, as memctl calls it,
// over TLS with the client certificate of name.
func adminAPI(t *testing.T, addr, name string) poolv1.PoolClient {
	conn, err := session.ChannelTLS("tcp", addr, pooltest.ClientTLS(t, name))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return poolv1.NewPoolClient(conn)
}

// TestAttachGrants: over mutual TLS, a named segment is attached only by
// its creator's identity and the identities it granted; others are refused
// with ErrAccessDenied naming the grant mechanism and see nothing of it in
// List or Stat; attaching gives no right to free, a free grant does; a
// second process with the creator's certificate has the creator's rights;
// a call without a session is an administrator's only from an identity in
// --admin; a peer daemon's session acts as its node certificate only (it
// lists every segment without keys, and attaches no name not granted to
// it); a session id is useless to another identity.
func TestAttachGrants(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	cfg.Admins = append(cfg.Admins, "cn:admin")
	d := pooltest.Start(t, cfg)
	addr := d.ListenAddr()
	ctx := t.Context()
	top := t // certificates of one CA: made with the test's t, not a subtest's

	dial := func(id, cn string) *client {
		c, err := dialSession(top, "tcp", addr, id, pooltest.ClientTLS(top, cn))
		require.NoError(t, err)
		return c
	}
	app, app2, mallory, ops := dial("app-1", "app"), dial("app2-1", "app2"), dial("mallory-1", "mallory"), dial("ops-1", "ops")
	attach := func(c *client, name string) (*poolv1.Segment, error) {
		seg, err := c.api.Attach(c.ctx(t), &poolv1.AttachRequest{Name: name})
		return seg, errs.FromStatus(err)
	}
	free := func(c *client, name string) error {
		_, err := c.api.Free(c.ctx(t), &poolv1.FreeRequest{Name: name})
		return errs.FromStatus(err)
	}

	secret, err := app.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Name: "app-secret", Allow: []string{"cn:app2"}, AllowFree: []string{"cn:ops"}})
	require.NoError(t, err)
	require.Equal(t, "cn:app", secret.Creator)
	dc, err := data(t, secret, secret.DataCredential)
	require.NoError(t, err)
	require.NoError(t, dc.Write(ctx, region(secret), 0, []byte("secret")))
	_, err = app.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Name: "app-private"})
	require.NoError(t, err)

	t.Run("another identity is refused and sees nothing", func(t *testing.T) {
		_, err := attach(mallory, "app-secret")
		require.ErrorIs(t, err, errs.ErrAccessDenied)
		require.ErrorContains(t, err, "created by cn:app, which has not granted cn:mallory")
		require.ErrorContains(t, err, `alloc.AllowIdentity("cn:mallory")`)
		require.ErrorContains(t, err, "memctl alloc --name app-secret --allow cn:mallory")
		require.ErrorIs(t, free(mallory, "app-secret"), errs.ErrAccessDenied)
		resp, err := mallory.api.List(mallory.ctx(t), &poolv1.ListRequest{})
		require.Empty(t, names(t, resp, err), "names are listed only to who may open them")
		_, err = mallory.api.Stat(mallory.ctx(t), &poolv1.StatRequest{Id: secret.Id})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
	})
	t.Run("a granted identity attaches, reads, and may not free", func(t *testing.T) {
		seg, err := attach(app2, "app-secret")
		require.NoError(t, err)
		require.Len(t, seg.Key, 16)
		dc2, err := data(t, seg, seg.DataCredential)
		require.NoError(t, err)
		got := make([]byte, 6)
		require.NoError(t, dc2.Read(ctx, region(seg), 0, got))
		require.Equal(t, "secret", string(got))
		err = free(app2, "app-secret")
		require.ErrorIs(t, err, errs.ErrAccessDenied, "attaching gives no right to free")
		require.ErrorContains(t, err, "granted the free right")
		_, err = attach(app2, "app-private")
		require.ErrorIs(t, err, errs.ErrAccessDenied, "a grant is per segment")
		resp, err := app2.api.List(app2.ctx(t), &poolv1.ListRequest{})
		require.Equal(t, []string{"app-secret"}, names(t, resp, err))
	})
	t.Run("the creator's certificate in another process has the creator's rights", func(t *testing.T) {
		again := dial("app-2", "app")
		seg, err := attach(again, "app-private")
		require.NoError(t, err)
		require.Len(t, seg.Key, 16)
		resp, err := again.api.List(again.ctx(t), &poolv1.ListRequest{})
		require.ElementsMatch(t, []string{"app-secret", "app-private"}, names(t, resp, err))
		require.NoError(t, free(again, "app-private"))
	})
	t.Run("calls without a session are administrators' only", func(t *testing.T) {
		anon := adminAPI(top, addr, "mallory")
		_, err := anon.Free(ctx, &poolv1.FreeRequest{Name: "app-secret"})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
		require.ErrorContains(t, err, "cn:mallory is not one (poold --admin names them)")
		_, err = anon.Alloc(ctx, &poolv1.AllocRequest{Size: 4096, Name: "squat"})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
		_, err = anon.Drain(ctx, &poolv1.DrainRequest{})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
		resp, err := anon.List(ctx, &poolv1.ListRequest{})
		require.Empty(t, names(t, resp, err))

		adm := adminAPI(top, addr, "admin")
		resp, err = adm.List(ctx, &poolv1.ListRequest{})
		require.Equal(t, []string{"app-secret"}, names(t, resp, err), "an administrator sees every name")
		require.Len(t, resp.Segments[0].Key, 16)
		require.Equal(t, []string{"cn:app2"}, resp.Segments[0].Allow)
		require.Equal(t, []string{"cn:ops"}, resp.Segments[0].AllowFree)
		seg, err := adm.Alloc(ctx, &poolv1.AllocRequest{Size: 4096, Name: "by-admin", Allow: []string{"cn:app2"}})
		require.NoError(t, err)
		require.Equal(t, "cn:admin", seg.Creator)
		_, err = attach(app2, "by-admin")
		require.NoError(t, err)
		_, err = adm.Free(ctx, &poolv1.FreeRequest{Name: "by-admin"})
		require.NoError(t, err)
	})
	t.Run("without a live session an identity sees what its client ids own", func(t *testing.T) {
		gone := dial("app-3", "app")
		kept, err := gone.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
		require.NoError(t, err)
		require.NoError(t, gone.s.Close())
		ids := func(api poolv1.PoolClient) []uint64 {
			resp, err := api.List(ctx, &poolv1.ListRequest{})
			require.NoError(t, err)
			var out []uint64
			for _, s := range resp.Segments {
				require.Empty(t, s.Key, "no keys without a session")
				out = append(out, s.Id)
			}
			return out
		}
		require.Contains(t, ids(adminAPI(top, addr, "app")), kept.Id, "as a peer daemon reconciling after its session ended")
		require.NotContains(t, ids(adminAPI(top, addr, "mallory")), kept.Id)
		_, err = adminAPI(top, addr, "admin").Free(ctx, &poolv1.FreeRequest{Id: kept.Id})
		require.NoError(t, err)
	})
	t.Run("a peer daemon acts as its own certificate only", func(t *testing.T) {
		tc, err := certs.ForTest(top, "peer-x", true).Client()
		require.NoError(t, err)
		peer, err := dialSession(top, "tcp", addr, "poold/peer-x", tc)
		require.NoError(t, err)
		_, err = peer.api.Attach(peer.ctx(t), &poolv1.AttachRequest{Name: "app-secret"})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied, "a node cannot claim a name for its clients")
		require.ErrorContains(t, err, "has not granted cn:peer-x")
		resp, err := peer.api.List(peer.ctx(t), &poolv1.ListRequest{})
		require.Contains(t, names(t, resp, err), "app-secret", "a peer sees every segment's metadata")
		for _, s := range resp.Segments {
			require.Empty(t, s.Key, "and no key it may not use")
		}
	})
	t.Run("a session id is useless to another identity", func(t *testing.T) {
		_, sid, err := app.s.Call(ctx)
		require.NoError(t, err)
		stolen := metadata.AppendToOutgoingContext(ctx, pool.SessionHeader, sid)
		_, err = mallory.api.Attach(stolen, &poolv1.AttachRequest{Name: "app-secret"})
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
		require.ErrorContains(t, err, "the call comes from cn:mallory")
	})
	t.Run("bad grants", func(t *testing.T) {
		for _, req := range []*poolv1.AllocRequest{
			{Size: 4096, Name: "x", Allow: []string{"app2"}},
			{Size: 4096, Name: "x", Allow: []string{"uid:-1"}},
			{Size: 4096, Name: "x", AllowFree: []string{"cn:"}},
			{Size: 4096, Allow: []string{"cn:app2"}},
		} {
			_, err := app.alloc(t, req)
			require.ErrorIs(t, err, errs.ErrInvalid, "%v", req)
		}
	})
	t.Run("a free grant frees", func(t *testing.T) {
		_, err := attach(ops, "app-secret")
		require.NoError(t, err)
		require.NoError(t, free(ops, "app-secret"))
		_, err = attach(app, "app-secret")
		require.ErrorIs(t, err, errs.ErrNotFound)
	})
}

// grantsHelperEnv makes TestGrantsHelper use the socket it names.
const grantsHelperEnv = "FARMEM_TEST_GRANTS_SOCKET"

// TestGrantsHelper is not a test on its own: TestAttachGrantsUnixSocket
// runs the test binary as nobody (uid and gid 65534) with it.
func TestGrantsHelper(t *testing.T) {
	sock := os.Getenv(grantsHelperEnv)
	if sock == "" {
		t.Skip("helper process of TestAttachGrantsUnixSocket")
	}
	c, err := dialSession(t, "unix", sock, "nobody-1", nil)
	require.NoError(t, err)
	attach := func(name string) error {
		_, err := c.api.Attach(c.ctx(t), &poolv1.AttachRequest{Name: name})
		return errs.FromStatus(err)
	}
	err = attach("root-secret")
	require.ErrorIs(t, err, errs.ErrAccessDenied)
	require.ErrorContains(t, err, "created by uid:0, which has not granted uid:65534")
	require.NoError(t, attach("for-nobody"))
	require.NoError(t, attach("for-group"), "gid:65534 is nobody's primary gid")
	resp, err := c.api.List(c.ctx(t), &poolv1.ListRequest{})
	require.ElementsMatch(t, []string{"for-nobody", "for-group"}, names(t, resp, err))
	_, err = c.api.Free(c.ctx(t), &poolv1.FreeRequest{Name: "for-nobody"})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied, "attaching gives no right to free")

	conn, err := session.Channel("unix", sock)
	require.NoError(t, err)
	defer conn.Close()
	_, err = poolv1.NewPoolClient(conn).Free(t.Context(), &poolv1.FreeRequest{Name: "root-secret"})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied, "uid 65534 is allowed on the socket, not an administrator")
	fmt.Println("grants checked as uid", os.Getuid())
}

// TestAttachGrantsUnixSocket: on the unix socket, with two uids allowed, a
// process of the other uid attaches only the names granted to its uid or
// its primary gid, lists only those, may not free them, and is no
// administrator without a session.
func TestAttachGrantsUnixSocket(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as nobody")
	}
	cfg := pooltest.Config(t)
	cfg.AllowUIDs = append(cfg.AllowUIDs, 65534)
	pooltest.Start(t, cfg)
	root, err := dialSession(t, "unix", cfg.Socket, "root-1", nil)
	require.NoError(t, err)
	for name, allow := range map[string][]string{"root-secret": nil, "for-nobody": {"uid:65534"}, "for-group": {"gid:65534"}} {
		_, err := root.alloc(t, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: name, Allow: allow})
		require.NoError(t, err)
	}
	out, err := runAsNobody(t, cfg.Socket, "TestGrantsHelper", grantsHelperEnv)
	require.NoError(t, err, "%s", out)
	require.Contains(t, out, "grants checked as uid 65534")
}
