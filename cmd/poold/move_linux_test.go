package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
)

// moveCluster is three real poolds for the move tests: a, whose clients'
// rdma segments live on its peers, and b and c, which lend memory.
type moveCluster struct {
	a, b, c    *daemon
	na, nb, nc gossipNode
	bArgs      []string
	cArgs      []string
	aArgs      []string
}

// startMoveCluster starts a, b and c (each of b and c lending export
// bytes) and waits until a sees both lenders' memory.
func startMoveCluster(t *testing.T, export string) *moveCluster {
	mc := &moveCluster{na: tlsGossip(t, "a"), nb: tlsGossip(t, "b"), nc: tlsGossip(t, "c")}
	key := certs.GossipKeyFile(certDir(t))
	mc.aArgs = append(mc.na.args(), "--gossip-key-file", key)
	mc.a = startDaemon(t, mc.na.data, mc.na.sock, mc.aArgs...)
	mc.bArgs = append(mc.nb.args(), "--gossip-key-file", key, "--export-size", export, "--join", mc.na.gossip)
	mc.b = startDaemon(t, mc.nb.data, mc.nb.sock, mc.bArgs...)
	mc.cArgs = append(mc.nc.args(), "--gossip-key-file", key, "--export-size", export, "--join", mc.na.gossip)
	mc.c = startDaemon(t, mc.nc.data, mc.nc.sock, mc.cArgs...)
	require.Eventually(t, func() bool {
		var nodes []nodeView
		if memctlJSON(t.Context(), mc.na.sock, &nodes, "nodes") != nil {
			return false
		}
		lenders := 0
		for _, n := range nodes {
			for _, ti := range n.Tiers {
				if n.State == "alive" && (n.Name == "b" || n.Name == "c") && ti.Tier == "rdma" && ti.Free > 0 {
					lenders++
				}
			}
		}
		return lenders == 2
	}, 30*time.Second, 50*time.Millisecond, "a never saw b and c lend memory")
	return mc
}

// other is the lender that is not node.
func other(node string) string {
	if node == "b" {
		return "c"
	}
	return "b"
}

// TestMoveKeepsBytes: a segment a placed on b or c moves to the other
// lender with alloc.Client.Move and back; its bytes are there after each
// move, writes and atomics after it land at the new home, and the old
// home's memory is free again.
func TestMoveKeepsBytes(t *testing.T) {
	mc := startMoveCluster(t, "32MiB")
	ctx := t.Context()
	c, err := alloc.Dial(ctx, mc.na.sock, alloc.WithClientID("move-app"))
	require.NoError(t, err)
	defer c.Close()
	const size = 4 << 20
	seg, err := c.Alloc(ctx, size, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	_, err = seg.WriteAt(want, 0)
	require.NoError(t, err)

	for i := range 2 {
		from := seg.Node()
		to := other(from)
		require.NoError(t, c.Move(ctx, seg, alloc.ToNode(to)), "move %d", i)
		require.Equal(t, to, seg.Node(), "move %d: the segment names its new home", i)
		got := make([]byte, size)
		_, err = seg.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "move %d: the bytes moved", i)
		want[i] = 0xEE
		_, err = seg.WriteAt(want[i:i+1], int64(i))
		require.NoError(t, err)
		sum, err := seg.Add64(size-8, 1)
		require.NoError(t, err)
		wantWord := uint64(0)
		for j := range 8 {
			wantWord |= uint64(want[size-8+j]) << (8 * j)
		}
		require.Equal(t, wantWord+1, sum, "move %d: the counter moved", i)
		want[size-8]++ // little endian: the low byte, no carry from these bytes
		_, err = seg.ReadAt(got, 0)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "move %d: writes after it land at the new home", i)
		fromSock := mc.nb.sock
		if from == "c" {
			fromSock = mc.nc.sock
		}
		require.Eventually(t, func() bool { return lentSegments(t, fromSock) == 0 }, 10*time.Second, 50*time.Millisecond,
			"move %d: %s still holds the segment", i, from)
	}
}

// lentSegments is how many segments the daemon on sock holds for its peers.
func lentSegments(t *testing.T, sock string) int {
	var rows []segmentRow
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := memctlJSON(ctx, sock, &rows, "segments"); err != nil {
		t.Logf("%v", err)
		return -1
	}
	n := 0
	for _, r := range rows {
		if strings.HasPrefix(r.Owner, "poold/") {
			n++
		}
	}
	return n
}
