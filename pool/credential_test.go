package pool

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// credCluster is two daemons, a and b, with mutual TLS on the control plane
// and TLS on the data plane, and clients of a over TCP with certificates.
type credCluster struct {
	t    *testing.T
	a, b *Daemon
}

func startCredCluster(t *testing.T) *credCluster {
	a := startNode(t, clusterNodeConfig(t, "a"))
	b := startNode(t, clusterNodeConfig(t, "b"), a)
	require.Eventually(t, func() bool {
		m, ok := a.pool.gossip().Member("b")
		return ok && m.State == cluster.StateAlive
	}, 10*time.Second, 10*time.Millisecond)
	return &credCluster{t: t, a: a, b: b}
}

// appClient is a client of a, as an attacker would hold it: the raw
// control plane, its session, and the certificate it dialed with.
type appClient struct {
	s    *session.Conn
	cert *tls.Config
}

// client opens a session with a as client id over a certificate for cn.
func (cc *credCluster) client(id, cn string) *appClient {
	t := cc.t
	tc, err := certs.ForTest(t, cn, false).Client()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := session.Dial(ctx, "tcp", cc.a.ListenAddr(), session.Options{ClientID: id, TLS: tc})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return &appClient{s: s, cert: tc}
}

func (c *appClient) ctx(t *testing.T) context.Context {
	ctx, _, err := c.s.Call(t.Context())
	require.NoError(t, err)
	return ctx
}

// allocOn allocates an rdma segment homed on node (a: on a's own data
// plane; b: placed by a on its peer), with req's name and grants.
func (c *appClient) allocOn(t *testing.T, node string, req *poolv1.AllocRequest) *poolv1.Segment {
	req.Size, req.Tier, req.HomeOnly = 4096, poolv1.Tier_TIER_RDMA, node == "a"
	var seg *poolv1.Segment
	require.Eventually(t, func() bool {
		var err error
		seg, err = c.s.API().Alloc(c.ctx(t), req)
		require.NoError(t, errs.FromStatus(err))
		if seg.Node == node {
			return true
		}
		_, err = c.s.API().Free(c.ctx(t), &poolv1.FreeRequest{Id: seg.Id})
		require.NoError(t, errs.FromStatus(err))
		return false
	}, 20*time.Second, 10*time.Millisecond)
	require.Len(t, seg.DataCredential, 16, "a client gets a data-plane credential for its segment")
	return seg
}

// dataConn dials seg's home with cred over TLS, presenting cert's
// certificate when cert is not nil.
func dataConn(t *testing.T, seg *poolv1.Segment, cred []byte, cert *tls.Config) (*tcp.Client, error) {
	require.True(t, seg.DataTls, "the data plane serves TLS when the control plane has it")
	tc, err := certs.Verifier(seg.DataTlsCa, seg.DataServerName)
	require.NoError(t, err)
	if cert != nil {
		tc.Certificates = cert.Certificates
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dc, err := tcp.Dial(ctx, seg.DataAddr, tcp.WithCredential(cred), tcp.WithTLS(tc), tcp.WithConns(1))
	if err == nil {
		t.Cleanup(func() { dc.Close() })
	}
	return dc, err
}

func segRegion(seg *poolv1.Segment) rdma.Region {
	var k rdma.Key
	copy(k[:], seg.Key)
	return rdma.Region{Segment: seg.HomeId, Key: k, Epoch: seg.Epoch}
}

// TestCredentialIsPerClient: two clients of node a with different
// identities each hold segments on the same home (b, placed by a; and a
// itself). Client 2 learns client 1's segment id and key and tries to read
// and overwrite it on the home's data plane with its own legitimate
// credential: refused (ACCESS_DENIED), and the data is unchanged. The two
// clients' credentials at b differ (a hands each client one b delegated
// to it, never a's own peer credential).
func TestCredentialIsPerClient(t *testing.T) {
	cc := startCredCluster(t)
	app1, app2 := cc.client("cred-app-1", "app1"), cc.client("cred-app-2", "app2")
	for _, home := range []string{"b", "a"} {
		t.Run("home-"+home, func(t *testing.T) {
			victim := app1.allocOn(t, home, &poolv1.AllocRequest{})
			own := app2.allocOn(t, home, &poolv1.AllocRequest{})
			require.NotEqual(t, victim.DataCredential, own.DataCredential)

			secret := []byte("client 1's data, not client 2's")
			dc1, err := dataConn(t, victim, victim.DataCredential, nil)
			require.NoError(t, err)
			require.NoError(t, dc1.Write(t.Context(), segRegion(victim), 0, secret))

			dc2, err := dataConn(t, own, own.DataCredential, nil)
			require.NoError(t, err)
			require.NoError(t, dc2.Write(t.Context(), segRegion(own), 0, []byte("its own segment works")))
			buf := make([]byte, len(secret))
			require.ErrorIs(t, dc2.Read(t.Context(), segRegion(victim), 0, buf), rdma.ErrAccessDenied)
			require.ErrorIs(t, dc2.Write(t.Context(), segRegion(victim), 0, []byte("overwritten by client 2")), rdma.ErrAccessDenied)
			_, err = dc2.FetchAdd64(t.Context(), segRegion(victim), 0, 1)
			require.ErrorIs(t, err, rdma.ErrAccessDenied)

			require.NoError(t, dc1.Read(t.Context(), segRegion(victim), 0, buf))
			require.Equal(t, secret, buf, "the victim's data is unchanged")
		})
	}
}

// TestCredentialAttacherByGrant: an identity granted a named segment
// (AllowIdentity) attaches it and reads and writes it on the home's data
// plane with its own credential; once it detaches, the same connection is
// refused. Homed on a peer (b) and on a itself.
func TestCredentialAttacherByGrant(t *testing.T) {
	cc := startCredCluster(t)
	app1, app2 := cc.client("grant-app-1", "app1"), cc.client("grant-app-2", "app2")
	for _, home := range []string{"b", "a"} {
		t.Run("home-"+home, func(t *testing.T) {
			name := "shared-on-" + home
			seg := app1.allocOn(t, home, &poolv1.AllocRequest{Name: name, Allow: []string{"cn:app2"}})
			app2.allocOn(t, home, &poolv1.AllocRequest{}) // app2's credential at the home exists before the attach
			att, err := app2.s.API().Attach(app2.ctx(t), &poolv1.AttachRequest{Name: name})
			require.NoError(t, errs.FromStatus(err))
			require.Equal(t, seg.HomeId, att.HomeId)
			require.Len(t, att.DataCredential, 16)

			dc, err := dataConn(t, att, att.DataCredential, nil)
			require.NoError(t, err)
			require.NoError(t, dc.Write(t.Context(), segRegion(att), 0, []byte("from the attacher")))
			buf := make([]byte, 17)
			require.NoError(t, dc.Read(t.Context(), segRegion(att), 0, buf))
			require.Equal(t, "from the attacher", string(buf))

			_, err = app2.s.API().Detach(app2.ctx(t), &poolv1.DetachRequest{Id: att.Id})
			require.NoError(t, errs.FromStatus(err))
			require.ErrorIs(t, dc.Read(t.Context(), segRegion(att), 0, buf), rdma.ErrAccessDenied)
			require.ErrorIs(t, dc.Write(t.Context(), segRegion(att), 0, []byte("after detaching")), rdma.ErrAccessDenied)

			dc1, err := dataConn(t, seg, seg.DataCredential, nil)
			require.NoError(t, err)
			require.NoError(t, dc1.Read(t.Context(), segRegion(seg), 0, buf))
			require.Equal(t, "from the attacher", string(buf), "the owner still reads it")
		})
	}
}

// TestCredentialBoundToCertificate: a client's credential presented over a
// data-plane connection whose client certificate names another identity
// is refused at the handshake; over the client's own certificate, or
// without one, it is accepted. The alloc library, dialed over TCP with a
// certificate, presents it on the data plane and reads and writes its
// segment on a peer.
func TestCredentialBoundToCertificate(t *testing.T) {
	cc := startCredCluster(t)
	app1, app2 := cc.client("bound-app-1", "app1"), cc.client("bound-app-2", "app2")
	for _, home := range []string{"b", "a"} {
		t.Run("home-"+home, func(t *testing.T) {
			seg := app1.allocOn(t, home, &poolv1.AllocRequest{})
			_, err := dataConn(t, seg, seg.DataCredential, app2.cert)
			require.ErrorIs(t, err, rdma.ErrAccessDenied)
			dc, err := dataConn(t, seg, seg.DataCredential, app1.cert)
			require.NoError(t, err)
			require.NoError(t, dc.Write(t.Context(), segRegion(seg), 0, []byte("own certificate")))
			_, err = dataConn(t, seg, seg.DataCredential, nil)
			require.NoError(t, err)
		})
	}

	// The library places on the peer (b) first.
	lib, err := alloc.Dial(t.Context(), "tcp://"+cc.a.ListenAddr(), alloc.WithTLS(app1.cert), alloc.WithClientID("bound-lib"))
	require.NoError(t, err)
	defer lib.Close()
	var s *alloc.Segment
	require.Eventually(t, func() bool {
		s, err = lib.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierRDMA))
		require.NoError(t, err)
		if s.Node() == "b" {
			return true
		}
		require.NoError(t, s.Free(t.Context()))
		return false
	}, 20*time.Second, 10*time.Millisecond)
	_, err = s.WriteAt([]byte("through the library"), 0)
	require.NoError(t, err)
	buf := make([]byte, 19)
	_, err = s.ReadAt(buf, 0)
	require.NoError(t, err)
	require.Equal(t, "through the library", string(buf))
}

// TestDelegateOnlyForPeers: a client's session cannot ask for delegated
// credentials nor authorize anyone, nor set how a copy is replicated or
// report a failed forward (peer-only calls), a client id of the delegated form
// (poold/NODE/CLIENT) is refused for a session, and a local client cannot take a
// peer daemon's id (poold/NODE), which would lock that node's daemon out here
// and give the client's segments the peer lease; nor can a TLS client whose
// certificate is not a node's.
func TestDelegateOnlyForPeers(t *testing.T) {
	cc := startCredCluster(t)
	app := cc.client("deleg-app", "app1")
	_, err := app.s.API().Delegate(app.ctx(t), &poolv1.DelegateRequest{ClientId: "x", Identity: "cn:app1"})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
	_, err = app.s.API().Authorize(app.ctx(t), &poolv1.AuthorizeRequest{Ids: []uint64{1}, ClientId: "x"})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
	_, err = app.s.API().Replicate(app.ctx(t), &poolv1.ReplicateRequest{HomeId: 1, Writers: []string{"x"}})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
	_, err = app.s.API().HomeFailed(app.ctx(t), &poolv1.HomeFailedRequest{HomeId: 1, TargetNode: "b", TargetHomeId: 1})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrAccessDenied)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = session.Dial(ctx, "unix", cc.a.cfg.Socket, session.Options{ClientID: "poold/b/app"})
	require.ErrorIs(t, err, errs.ErrInvalid)
	_, err = session.Dial(ctx, "unix", cc.a.cfg.Socket, session.Options{ClientID: "poold/b"})
	require.ErrorIs(t, err, errs.ErrAccessDenied, "a local client takes no peer daemon's id")

	// Over TLS a peer's id needs the node's certificate, not only its
	// name: a client certificate of the same CA that names a node (or a
	// name no node has) is refused, so that its sessions cannot forward
	// ops on the data plane, which only peers' may.
	for _, name := range []string{"b", "app9"} {
		tc, err := certs.ForTest(t, name, false).Client()
		require.NoError(t, err)
		_, err = session.Dial(ctx, "tcp", cc.a.ListenAddr(), session.Options{ClientID: "poold/" + name, TLS: tc})
		require.ErrorIs(t, err, errs.ErrAccessDenied, "a client certificate named %s takes no peer daemon's id", name)
	}
	tc, err := certs.ForTest(t, "b", true).Client()
	require.NoError(t, err)
	peer, err := session.Dial(ctx, "tcp", cc.a.ListenAddr(), session.Options{ClientID: "poold/b", TLS: tc})
	require.NoError(t, err, "b's node certificate opens b's peer session")
	peer.Close()
}

// TestCredentialResyncsHome: a home whose record of a segment names none
// of the placing node's clients (placed before homes recorded them) serves
// the owner once the placing node asks for the owner's credential on a
// new peer session, which first tells the home who may use each segment
// placed there.
func TestCredentialResyncsHome(t *testing.T) {
	cc := startCredCluster(t)
	app := cc.client("resync-app", "app1")
	seg := app.allocOn(t, "b", &poolv1.AllocRequest{})
	dc, err := dataConn(t, seg, seg.DataCredential, nil)
	require.NoError(t, err)
	require.NoError(t, dc.Write(t.Context(), segRegion(seg), 0, []byte("before")))

	b := cc.b.pool
	b.mu.Lock()
	r := b.segs[seg.HomeId]
	require.Equal(t, []string{"resync-app"}, r.Delegates)
	r.Delegates = nil // as a record from before
	b.allowData(r)
	b.mu.Unlock()
	buf := make([]byte, 6)
	require.ErrorIs(t, dc.Read(t.Context(), segRegion(seg), 0, buf), rdma.ErrAccessDenied)

	cc.a.pool.deleg.mu.Lock()
	cc.a.pool.deleg.homes = nil // as after a new session with b
	cc.a.pool.deleg.mu.Unlock()
	cc.a.pool.told.mu.Lock()
	cc.a.pool.told.nodes = nil
	cc.a.pool.told.mu.Unlock()
	again, err := app.s.API().Stat(app.ctx(t), &poolv1.StatRequest{Id: seg.Id})
	require.NoError(t, errs.FromStatus(err))
	require.Len(t, again.DataCredential, 16)
	require.NoError(t, dc.Read(t.Context(), segRegion(seg), 0, buf))
	require.Equal(t, "before", string(buf))
}

// TestForwardersArePeerDaemons: the data plane takes forwarded ops only
// from a peer daemon's own sessions (poold/NODE), not from the clients a
// peer acts for on delegated credentials (poold/NODE/CLIENT), whose
// origin blocks name client sessions and must stay apart from the
// forwarders' (tcp.ServerConfig.Forwarders).
func TestForwardersArePeerDaemons(t *testing.T) {
	for id, want := range map[string]bool{"poold/a": true, "poold/a/app": false, "poold/": false, "app": false, "poold": false} {
		require.Equal(t, want, isPeerDaemon(id), id)
	}
}
