package pool

import (
	"bytes"
	"testing"
	"time"

	"context"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// TestPromoteDeviceReplaced: on 2 simulated hosts, an rdma segment the
// origin placed on the other host is promoted to the origin's cxl tier,
// and the origin's cxl device is replaced under its name (taken away and
// back with an allocator of its own, as hotplug does) while the copy runs,
// when the source seals: the new device's allocator does not hold the
// extent the copy went to. The promotion fails with ErrNoCapacity naming
// the change; the segment stays on the rdma tier at its old home, whole,
// unsealed (its owner writes there) and free to move; nothing is taken on
// the new device, and no backing of the segment is left there. Promoted
// again, it lands on the new device with every byte.
func TestPromoteDeviceReplaced(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 2, leaseTTL: 10 * time.Second})
	oh, sh := sc.hosts[0], sc.hosts[1] // the origin, and the source: the home of its rdma segments
	// swapAt, once set, runs when the source is asked to seal: the copy is
	// under way, its last chunks not copied yet.
	swapAt := make(chan func(), 1)
	sh.cfg.sim.grpc = append(sh.cfg.sim.grpc, grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if mo, ok := req.(*poolv1.MoveOutRequest); ok && mo.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL {
				select {
				case swap := <-swapAt:
					swap()
				default:
				}
			}
			return h(ctx, req)
		}))
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()
	origin := oh.daemon()

	const size = 1 << 20
	conn, call := appSession(t, oh)
	seg, err := conn.API().Alloc(call(), &poolv1.AllocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, Name: "promoted"})
	require.NoError(t, err)
	require.Equal(t, sh.name, seg.Node)
	want := bytes.Repeat([]byte{0xa5, 0x5a, 0x3c}, size/3+1)[:size]
	dc, err := dialHome(ctx, seg.Node, seg.DataAddr, false, nil, seg.DataCredential)
	require.NoError(t, err)
	defer dc.Close()
	require.NoError(t, dc.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: segRegion(seg), Buf: want}))

	var d *dev
	for _, x := range origin.pool.devices() {
		if x.tier == poolv1.Tier_TIER_CXL {
			d = x
		}
	}
	require.NotNil(t, d, "the origin's emulated cxl device")
	back := &dev{Device: d.Device, tier: d.tier, usable: true, note: d.note}
	swapAt <- func() {
		origin.pool.mu.Lock()
		defer origin.pool.mu.Unlock()
		replaceDevLocked(t, origin.pool, d, back)
	}
	promote := func() error {
		_, err := conn.API().Move(call(), &poolv1.MoveRequest{Id: seg.Id, ToTier: poolv1.Tier_TIER_CXL})
		return errs.FromStatus(err)
	}
	err = promote()
	require.Empty(t, swapAt, "the device was replaced during the copy")
	require.ErrorIs(t, err, errs.ErrNoCapacity)
	require.ErrorContains(t, err, "replaced")
	require.ErrorContains(t, err, d.Name())
	require.ErrorContains(t, err, "move it again", "and says what to do")
	t.Logf("the failed promotion: %v", err)

	r, err := origin.pool.Stat(seg.Id)
	require.NoError(t, err)
	require.Equal(t, poolv1.Tier_TIER_RDMA, r.Tier, "the segment stays on the rdma tier")
	require.Equal(t, sh.name, r.Home, "at its old home")
	require.Equal(t, seg.HomeId, r.HomeID)
	require.False(t, r.Sealed)
	require.True(t, bytes.Equal(want, homeBytes(ctx, t, origin, homeRef{Node: r.Home, HomeID: r.HomeID, DataAddr: r.DataAddr, Key: r.Key, Epoch: r.Epoch}, size)),
		"the old home holds every byte")
	want[7] ^= 0xff
	require.NoError(t, dc.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: segRegion(seg), Offset: 7, Buf: want[7:8]}), "the old home takes writes: unsealed")
	require.Zero(t, back.ext.Stats().Used, "nothing is taken on the new device")
	ids, err := back.Device.(interface{ Segments() ([]uint64, error) }).Segments()
	require.NoError(t, err)
	require.NotContains(t, ids, seg.Id, "no backing of the segment is left on the device")

	require.NoError(t, promote(), "promoted again")
	r, err = origin.pool.Stat(seg.Id)
	require.NoError(t, err)
	require.Equal(t, poolv1.Tier_TIER_CXL, r.Tier)
	require.Equal(t, back, origin.pool.deviceNamed(r.Device), "on the device there now")
	require.Equal(t, roundUp(size, back.Align()), back.ext.Stats().Used, "its extent is the new device's")
	mp, err := origin.pool.mapLocal(back, r)
	require.NoError(t, err)
	defer mp.Close()
	require.True(t, bytes.Equal(want, mp.Bytes()[:size]), "every byte, the write after the failed promotion too")
}
