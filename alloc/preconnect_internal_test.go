package alloc

import (
	"errors"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestPreconnectBounds: a moving notice makes the client dial only for a
// segment it holds, one dial per address however many notices name it,
// at most maxPreconnects at once, none where it is connected already, and a dial that does not complete
// (a node that never answers the handshake) is abandoned by Client.Close,
// counted nowhere. (TestMovePreconnects, cmd/poold, checks the dials
// that complete, between real daemons.)
func TestPreconnectBounds(t *testing.T) {
	pcfg := pooltest.Config(t)
	pooltest.Start(t, pcfg)
	// The dials' own bound is far beyond the test's: only Close ends the
	// mute node's.
	c, err := Dial(t.Context(), pcfg.Socket, WithDialTimeout(time.Minute))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() }) // idempotent

	srv := tcp.NewServer(tcp.DefaultConfig())
	key, err := srv.Export(7, make([]byte, 4096), 1)
	require.NoError(t, err)
	home, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(home)
	t.Cleanup(func() { srv.Close() })
	seg, err := c.open(t.Context(), "", &poolv1.Segment{Id: 1 << 40, Tier: poolv1.Tier_TIER_RDMA, Size: 4096, Node: "h0",
		HomeId: 7, DataAddr: home.Addr().String(), Key: key[:], Epoch: 1}, allocConfig{})
	require.NoError(t, err)
	_, err = seg.ReadAt(make([]byte, 8), 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), c.Stats().DataConnects)

	mute, stranger := muteNode(t), muteNode(t)
	notice := func(id uint64, addr string) {
		c.segmentEvents(&poolv1.SegmentEvents{Moving: []*poolv1.SegmentMoving{{Id: id, Node: "h1", DataAddr: addr, DataCredential: []byte("cred")}}})
	}

	notice(seg.ID()+1, stranger.Addr().String()) // not a segment of this client
	notice(seg.ID(), home.Addr().String())       // connected there already
	for range 3 {
		notice(seg.ID(), mute.Addr().String())
	}
	nc, err := accept(mute, 10*time.Second)
	require.NoError(t, err, "the mute node is dialed")
	defer nc.Close()
	c.mu.Lock()
	dialing := maps.Clone(c.pre.addrs)
	c.mu.Unlock()
	require.Equal(t, map[string]bool{mute.Addr().String(): true}, dialing, "the dial to the mute node alone is under way")
	// At most maxPreconnects dials at once, whatever the notices name.
	for range maxPreconnects {
		notice(seg.ID(), muteNode(t).Addr().String())
	}
	c.mu.Lock()
	n := len(c.pre.addrs)
	c.mu.Unlock()
	require.Equal(t, maxPreconnects, n, "dials under way at once")

	require.NoError(t, nc.SetReadDeadline(time.Now().Add(10*time.Second)))
	require.NoError(t, c.Close()) // waits for the dials it ends
	// Close waited for the dials: one that was made is in a backlog.
	more, err := accept(mute, 100*time.Millisecond)
	if err == nil {
		more.Close()
	}
	require.Error(t, err, "the mute node was dialed again")
	_, err = nc.Read(make([]byte, 4096)) // the hello, then the client's hang-up
	for err == nil {
		_, err = nc.Read(make([]byte, 4096))
	}
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "Close abandoned the dial: %v", err)
	st := c.Stats()
	require.Equal(t, [2]int64{1, 0}, [2]int64{st.DataConnects, st.MovePreconnects}, "the abandoned dial is counted nowhere")
}

// muteNode is a node that accepts connections (accept) and never
// answers their handshake.
func muteNode(t *testing.T) *net.TCPListener {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// accept takes the next connection l holds or gets within d.
func accept(l *net.TCPListener, d time.Duration) (net.Conn, error) {
	if err := l.SetDeadline(time.Now().Add(d)); err != nil {
		return nil, err
	}
	return l.Accept()
}
