package alloc

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/pool"
)

// answerLost is a PoolClient whose Move calls reach the daemon and whose
// answers are then lost, as when the connection breaks after the daemon
// committed the move.
type answerLost struct{ poolv1.PoolClient }

func (a answerLost) Move(ctx context.Context, req *poolv1.MoveRequest, opts ...grpc.CallOption) (*poolv1.MoveResponse, error) {
	if _, err := a.PoolClient.Move(ctx, req, opts...); err != nil {
		return nil, err
	}
	return nil, status.Error(codes.Unavailable, "connection reset after the daemon answered")
}

// TestDemotionAnswerLost: a demotion to the rdma tier that the daemon
// made but whose answer the client never got is found out by asking the
// daemon: the Segment switches to the segment's new home, as if the answer
// had come, rather than going on writing the memory it mapped on the cxl
// tier, which is no longer the segment's. A fresh Open sees what it writes
// afterwards.
func TestDemotionAnswerLost(t *testing.T) {
	// Two daemons gossiping on loopback: a demotes to b's rdma tier.
	node := func(name string, join ...string) pool.Config {
		cfg := pooltest.Config(t)
		cfg.Node, cfg.Listen, cfg.Gossip, cfg.GossipProfile, cfg.Join = name, "127.0.0.1:0", "127.0.0.1:0", "local", join
		tf := certs.ForTest(t, name, true)
		cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = tf.Cert, tf.Key, tf.CA
		cfg.GossipKeyFile = certs.GossipKeyFile(filepath.Dir(tf.CA))
		return cfg
	}
	// b gossips on a port free for UDP and TCP when it was picked; another
	// test may take it meanwhile: then b tries another.
	cb := node("b")
	for try := 0; ; try++ {
		cb.Gossip = freeGossipAddr(t)
		b, err := pool.Start(cb, nil)
		if err == nil {
			t.Cleanup(func() { b.Close() })
			break
		}
		require.Less(t, try, 10, "no free gossip port: %v", err)
	}
	cfg := node("a", cb.Gossip)
	pooltest.Start(t, cfg)
	ctx := t.Context()
	c, err := Dial(ctx, cfg.Socket, WithClientID("answer-lost"), func(o *dialOptions) {
		o.api = func(api poolv1.PoolClient) poolv1.PoolClient { return answerLost{api} }
	})
	require.NoError(t, err)
	defer c.Close()
	require.Eventually(t, func() bool { // a places rdma segments on b once they gossip
		probe, err := c.Alloc(ctx, 1<<20, WithTier(TierRDMA))
		return err == nil && probe.Free(ctx) == nil
	}, 20*time.Second, 20*time.Millisecond, "a does not place on b")
	seg, err := c.Alloc(ctx, 1<<20, WithTier(TierCXL))
	require.NoError(t, err)
	_, err = seg.WriteAt([]byte("before the move"), 0)
	require.NoError(t, err)

	// The move needs b alive in a's view, which a loaded machine can
	// interrupt for a moment after the probe (a CI run saw "no alive
	// peer" here); a move refused for want of a peer changes nothing, so
	// it is asked again.
	require.Eventually(t, func() bool {
		err = c.Move(ctx, seg, ToTier(TierRDMA))
		return !errors.Is(err, ErrNoCapacity)
	}, 20*time.Second, 20*time.Millisecond, "a finds no peer to move to")
	require.NoError(t, err, "the daemon moved it; the lost answer is made up for")
	require.Equal(t, TierRDMA, seg.Tier())
	_, ok := seg.Bytes()
	require.False(t, ok, "no mapping of the memory the segment left")
	_, err = seg.WriteAt([]byte("after the move"), 4096)
	require.NoError(t, err)

	other, err := Dial(ctx, cfg.Socket, WithClientID("answer-lost"))
	require.NoError(t, err)
	defer other.Close()
	again, err := other.Open(ctx, seg.ID())
	require.NoError(t, err)
	require.Equal(t, TierRDMA, again.Tier())
	got := make([]byte, len("after the move"))
	_, err = again.ReadAt(got, 4096)
	require.NoError(t, err)
	require.Equal(t, "after the move", string(got), "the write after the move is the segment's")
	got = make([]byte, len("before the move"))
	_, err = again.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "before the move", string(got))
	require.NoError(t, again.Close())
	require.NoError(t, seg.Free(ctx))
}

// freeGossipAddr is a loopback address whose port was free for both UDP
// and TCP (memberlist binds both) when it returned.
func freeGossipAddr(t *testing.T) string {
	for {
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := tl.Addr().String()
		ul, err := net.ListenPacket("udp", addr)
		tl.Close()
		if err == nil {
			ul.Close()
			return addr
		}
	}
}
