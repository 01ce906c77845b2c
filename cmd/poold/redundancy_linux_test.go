package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/testcluster"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// redundantClient is a client of one poold, with a session on its unix
// socket, that reaches the homes' data planes from its host with raw
// data-plane connections (rdma/tcp), as the client library would.
type redundantClient struct {
	t    *testing.T
	host *testcluster.Host
	conn *session.Conn
}

func newRedundantClient(t *testing.T, n *poolNode, id string) *redundantClient {
	c, err := session.Dial(t.Context(), "unix", n.sock, session.Options{ClientID: id, ClientName: "redundancy test"})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &redundantClient{t: t, host: n.host, conn: c}
}

// call runs one control-plane call with the session.
func call[T any](rc *redundantClient, fn func(ctx context.Context, api poolv1.PoolClient) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(rc.t.Context(), 20*time.Second)
	defer cancel()
	cctx, _, err := rc.conn.Call(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	return fn(cctx, rc.conn.API())
}

func (rc *redundantClient) alloc(size int64, r *poolv1.Redundancy) *poolv1.Segment {
	seg, err := call(rc, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.Segment, error) {
		return api.Alloc(ctx, &poolv1.AllocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, Redundancy: r})
	})
	require.NoError(rc.t, err)
	return seg
}

func (rc *redundantClient) stat(id uint64) (*poolv1.Segment, error) {
	return call(rc, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.Segment, error) {
		return api.Stat(ctx, &poolv1.StatRequest{Id: id})
	})
}

// dial connects to a home's data plane from the client's host with the
// credential and TLS the answer gave for that home.
func (rc *redundantClient) dial(h *poolv1.SegmentHome) (*tcp.Client, rdma.Region) {
	opts := []tcp.Option{tcp.WithCredential(h.DataCredential), tcp.WithConns(1)}
	if h.DataTls {
		tc, err := certs.Verifier(h.DataTlsCa, h.DataServerName)
		require.NoError(rc.t, err)
		opts = append(opts, tcp.WithTLS(tc))
	}
	var c *tcp.Client
	require.NoError(rc.t, rc.host.Do(func() (err error) {
		c, err = tcp.Dial(rc.t.Context(), h.DataAddr, opts...)
		return err
	}), "dial home %s at %s", h.Node, h.DataAddr)
	rc.t.Cleanup(func() { c.Close() })
	var key rdma.Key
	copy(key[:], h.Key)
	return c, rdma.Region{Segment: h.HomeId, Key: key, Epoch: h.Epoch}
}

func (rc *redundantClient) read(h *poolv1.SegmentHome, off int64, n int) []byte {
	c, reg := rc.dial(h)
	b := make([]byte, n)
	require.NoError(rc.t, c.Read(rc.t.Context(), reg, off, b), "read home %s", h.Node)
	return b
}

// segmentRedundancy is `memctl segments -o json`'s view of a redundant
// segment.
type segmentRedundancy struct {
	ID              uint64 `json:"id"`
	Redundancy      string `json:"redundancy"`
	RedundancyState string `json:"redundancy_state"`
	Homes           []struct {
		Node, Role, State string
	} `json:"homes"`
}

// TestRedundantSegments runs six poolds in network namespaces, in two
// zones. A client of the origin allocates a replicas=2 and an ec=4+2 segment
// through the real API: their homes are on distinct hosts, the replicas
// in distinct zones, and memctl segments shows them. A write to the
// primary is on the backup when answered, and the client may only read
// the backup; a write to a data shard puts the Reed–Solomon parity of the
// stripe on the parity shards. kill -9 of the primary's host: the origin
// promotes the backup (Stat names it, the segment is degraded, the data
// is there and it takes writes). kill -9 of that host too: the replicated
// segment is lost, the erasure-coded one (two shards lost of two it
// covers) only degraded.
func TestRedundantSegments(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 6})
	// No rebuild (TestRebuildAfterHostLoss checks it): the losses' states stay.
	nodes := startPools(t, c, "--export-size", "16MiB", "--emulate-cxl", "8MiB", "--local-size", "4MiB", "--rebuild=false")
	waitAllAlive(t, nodes)
	a := nodes[0]
	rc := newRedundantClient(t, a, "app")
	zone := map[string]string{}
	for i, n := range nodes {
		zone[n.name] = zoneOf(i)
	}

	// The origin's own memory counts as a host; the copies this test kills
	// must be elsewhere, so it allocates until placement put both there.
	var rep *poolv1.Segment
	for range 50 {
		rep = rc.alloc(64<<10, &poolv1.Redundancy{Replicas: 2})
		require.Len(t, rep.Homes, 2)
		if rep.Homes[0].Node != a.name && rep.Homes[1].Node != a.name {
			break
		}
		_, err := call(rc, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.FreeResponse, error) {
			return api.Free(ctx, &poolv1.FreeRequest{Id: rep.Id})
		})
		require.NoError(t, err)
	}
	require.NotContains(t, []string{rep.Homes[0].Node, rep.Homes[1].Node}, a.name, "50 placements all used the origin's host")
	primary, backup := rep.Homes[0], rep.Homes[1]
	require.NotEqual(t, zone[primary.Node], zone[backup.Node], "the copies are in distinct zones")
	require.Equal(t, primary.Node, rep.Node, "the segment's own fields name the primary")
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_OK, rep.RedundancyState)

	// What placing and wiring the homes costs, beside a plain rdma
	// segment's placement on a peer (logged, not judged: one run).
	timed := func(r *poolv1.Redundancy) (*poolv1.Segment, time.Duration) {
		start := time.Now()
		seg := rc.alloc(100<<10, r)
		return seg, time.Since(start)
	}
	_, plain := timed(&poolv1.Redundancy{})
	_, two := timed(&poolv1.Redundancy{Replicas: 2})
	ec, coded := timed(&poolv1.Redundancy{DataShards: 4, ParityShards: 2})
	t.Logf("Alloc of 100 KiB on rdma: plain %v, replicas=2 %v, ec=4+2 %v", plain, two, coded)
	require.Len(t, ec.Homes, 6)
	require.Equal(t, int64(4096), ec.ShardChunk)
	require.Equal(t, int64(7*4*4096), ec.Size, "100 KiB padded to 7 stripes of 4 chunks")
	var ecNodes []string
	for _, h := range ec.Homes {
		ecNodes = append(ecNodes, h.Node)
	}
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(ecNodes))), 6, "six distinct hosts: %v", ecNodes)

	var listed []segmentRedundancy
	require.NoError(t, memctlJSON(t.Context(), a.sock, &listed, "segments"))
	views := map[uint64]segmentRedundancy{}
	for _, s := range listed {
		views[s.ID] = s
	}
	require.Equal(t, "replicas=2", views[rep.Id].Redundancy)
	require.Equal(t, "ok", views[rep.Id].RedundancyState)
	require.Equal(t, "primary", views[rep.Id].Homes[0].Role)
	require.Equal(t, "ec=4+2", views[ec.Id].Redundancy)
	require.Equal(t, "parity", views[ec.Id].Homes[5].Role)

	// Replicas: a write answered by the primary is on the backup; the
	// client only reads the backup.
	want := []byte("written through the primary")
	pc, preg := rc.dial(primary)
	require.NoError(t, pc.Write(t.Context(), preg, 1000, want))
	require.Equal(t, want, rc.read(backup, 1000, len(want)), "the backup holds the acknowledged write")
	bc, breg := rc.dial(backup)
	require.ErrorIs(t, bc.Write(t.Context(), breg, 0, []byte("x")), rdma.ErrAccessDenied, "clients write the primary only")

	// Erasure coding: the parity shards hold the stripe's parity.
	d0c, d0reg := rc.dial(ec.Homes[0])
	d2c, d2reg := rc.dial(ec.Homes[2])
	require.NoError(t, d0c.Write(t.Context(), d0reg, 4096+7, []byte("shard zero")))
	require.NoError(t, d2c.Write(t.Context(), d2reg, 4096+7, []byte("shard two!")))
	shards := make([][]byte, 6)
	for i, h := range ec.Homes {
		shards[i] = rc.read(h, 4096, 64)
	}
	enc, err := reedsolomon.New(4, 2)
	require.NoError(t, err)
	ok, err := enc.Verify(shards)
	require.NoError(t, err)
	require.True(t, ok, "the parity shards hold the Reed-Solomon parity of the data shards")

	// The primary's host dies: the backup is promoted.
	killed := nodeNamed(t, nodes, primary.Node)
	killed.kill9(t)
	var now *poolv1.Segment
	took := waitFor(t, 50*time.Millisecond, func() (bool, string) {
		now, err = rc.stat(rep.Id)
		if err != nil {
			return false, err.Error()
		}
		return now.Node == backup.Node, fmt.Sprintf("the segment names %s (state %s, redundancy %s)", now.Node, now.State, now.RedundancyState)
	})
	t.Logf("primary %s killed: backup %s promoted after %v", primary.Node, backup.Node, took)
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, now.RedundancyState)
	require.Equal(t, poolv1.SegmentState_SEGMENT_STATE_ACTIVE, now.State)
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, now.Homes[1].State, "the old primary is lost")
	require.Greater(t, now.Epoch, rep.Epoch, "the promotion raised the epoch")
	require.Equal(t, want, rc.read(now.Homes[0], 1000, len(want)), "the data is at the promoted copy")
	nc, nreg := rc.dial(now.Homes[0])
	require.NoError(t, nc.Write(t.Context(), nreg, 0, []byte("after the promotion")), "the promoted copy takes the client's writes")
	require.ErrorIs(t, nc.Write(t.Context(), rdma.Region{Segment: nreg.Segment, Key: nreg.Key, Epoch: rep.Epoch}, 0, []byte("x")), rdma.ErrLeaseExpired,
		"a write under the old epoch is refused")

	// The new primary's host dies too: more homes lost than replicas=2
	// covers; the ec=4+2 segment has lost two shards, as many as it covers.
	nodeNamed(t, nodes, backup.Node).kill9(t)
	waitFor(t, 50*time.Millisecond, func() (bool, string) {
		now, err = rc.stat(rep.Id)
		if err != nil {
			return false, err.Error()
		}
		return now.State == poolv1.SegmentState_SEGMENT_STATE_LOST, fmt.Sprintf("state %s, redundancy %s", now.State, now.RedundancyState)
	})
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_LOST, now.RedundancyState)
	waitFor(t, 50*time.Millisecond, func() (bool, string) {
		now, err = rc.stat(ec.Id)
		if err != nil {
			return false, err.Error()
		}
		lost := 0
		for _, h := range now.Homes {
			if h.State == poolv1.HomeState_HOME_STATE_LOST {
				lost++
			}
		}
		return lost == 2, fmt.Sprintf("%d shards lost, state %s, redundancy %s", lost, now.State, now.RedundancyState)
	})
	require.Equal(t, poolv1.SegmentState_SEGMENT_STATE_ACTIVE, now.State)
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, now.RedundancyState)
}
