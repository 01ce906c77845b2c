package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// TestRedundancyCellRebuilding: memctl segments shows a redundant
// segment's state with the share of its rebuilding homes' bytes copied
// so far (a copy holds the whole segment, a shard size / k), and of the
// replacement of a home that moves off its host ("moving"), and -o json
// has the bytes.
func TestRedundancyCellRebuilding(t *testing.T) {
	const (
		ok = poolv1.HomeState_HOME_STATE_OK
		rb = poolv1.HomeState_HOME_STATE_REBUILDING
	)
	seg := func(red *poolv1.Redundancy, st poolv1.RedundancyState, homes ...*poolv1.SegmentHome) *poolv1.Segment {
		return &poolv1.Segment{Size: 8 << 20, State: poolv1.SegmentState_SEGMENT_STATE_ACTIVE, Redundancy: red, RedundancyState: st, Homes: homes}
	}
	rep := &poolv1.Redundancy{Replicas: 2}
	ec := &poolv1.Redundancy{DataShards: 4, ParityShards: 2}
	for _, tc := range []struct {
		seg         *poolv1.Segment
		want        string
		done, total int64
	}{
		{&poolv1.Segment{State: poolv1.SegmentState_SEGMENT_STATE_ACTIVE}, "-", 0, 0},
		{seg(rep, poolv1.RedundancyState_REDUNDANCY_STATE_OK, &poolv1.SegmentHome{State: ok}, &poolv1.SegmentHome{State: ok}), "replicas=2 ok", 0, 0},
		{seg(rep, poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING, &poolv1.SegmentHome{State: ok}, &poolv1.SegmentHome{State: rb, RebuiltBytes: 3 << 20}), "replicas=2 rebuilding 37%", 3 << 20, 8 << 20},
		{seg(ec, poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING, &poolv1.SegmentHome{State: rb, RebuiltBytes: 1 << 20}, &poolv1.SegmentHome{State: ok},
			&poolv1.SegmentHome{State: rb, RebuiltBytes: 4 << 20}), "ec=4+2 rebuilding 75%", 3 << 20, 4 << 20},
		{seg(ec, poolv1.RedundancyState_REDUNDANCY_STATE_OK, &poolv1.SegmentHome{State: ok}, &poolv1.SegmentHome{State: ok, MovingTo: "g", RebuiltBytes: 1 << 20}),
			"ec=4+2 moving 50%", 1 << 20, 2 << 20},
	} {
		v := segmentView(tc.seg)
		require.Equal(t, tc.want, redundancyCell(v))
		require.Equal(t, tc.done, v.RebuiltBytes, tc.want)
		require.Equal(t, tc.total, v.RebuildBytes, tc.want)
	}
}
