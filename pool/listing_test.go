package pool

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// TestListEveryNodePaged: a List with all, in pages of 2, returns every
// node's segments once, by node and then id, across the page boundaries
// within and between nodes; a node refuses a page token from another
// node's own listing.
func TestListEveryNodePaged(t *testing.T) {
	a := startNode(t, clusterNodeConfig(t, "a"))
	b := startNode(t, clusterNodeConfig(t, "b"), a)
	require.Eventually(t, func() bool {
		m, ok := a.pool.gossip().Member("b")
		return ok && m.State == cluster.StateAlive && m.Meta.GRPCAddr != ""
	}, 20*time.Second, 20*time.Millisecond, "a never listed b alive")

	type at struct {
		node string
		id   uint64
	}
	var want []at
	for _, d := range []*Daemon{a, b} {
		for range 5 {
			r, err := d.pool.Alloc(context.Background(), caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
			require.NoError(t, err)
			want = append(want, at{d.cfg.Node, r.ID})
		}
	}

	conn, err := session.Channel("unix", a.cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)
	first, err := api.List(t.Context(), &poolv1.ListRequest{All: true, PageSize: 2})
	require.NoError(t, err)
	require.Len(t, first.Segments, 2)
	require.NotEmpty(t, first.NextPageToken)

	segs, err := poolv1.ListAll(t.Context(), api, &poolv1.ListRequest{All: true, PageSize: 2}, 0)
	require.NoError(t, err)
	var got []at
	for _, s := range segs {
		got = append(got, at{s.Node, s.Id})
	}
	require.Equal(t, want, got)

	own, err := api.List(t.Context(), &poolv1.ListRequest{PageSize: 2})
	require.NoError(t, err)
	bc, err := session.Channel("unix", b.cfg.Socket)
	require.NoError(t, err)
	defer bc.Close()
	_, err = poolv1.NewPoolClient(bc).List(t.Context(), &poolv1.ListRequest{PageToken: own.NextPageToken})
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrInvalid)
}
