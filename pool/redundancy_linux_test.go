package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	redspec "github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// fastDetection declares a crashed host dead within about a second.
func fastDetection(c *cluster.Config) {
	c.GossipInterval, c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = 50*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond, 2
}

// redundantCluster starts n simulated hosts in zones z0, z1, z0, z1, ...
// with the gossip timing given (nil: the lan profile), the first lending
// no memory when originOnly, and waits until they see each other. They
// rebuild no lost home (Config.Rebuild; TestRebuildSim checks rebuilds),
// so that a loss's states stay.
func redundantCluster(t *testing.T, n int, timing func(*cluster.Config), originOnly bool) *simCluster {
	sc := newSimCluster(t, simHostConfig{hosts: n, leaseTTL: 10 * time.Second, timing: timing})
	for i, h := range sc.hosts {
		h.cfg.Zone = fmt.Sprintf("z%d", i%2)
		h.cfg.Rebuild = false
	}
	if originOnly {
		sc.hosts[0].cfg.ExportSize = 0
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	return sc
}

// heldFor is the ids of the segments each running host holds for node.
func (sc *simCluster) heldFor(node string) map[string][]uint64 {
	out := map[string][]uint64{}
	for _, h := range sc.up() {
		for _, r := range h.daemon().pool.List() {
			if r.Owner == peerClientPrefix+node {
				out[h.name] = append(out[h.name], r.ID)
			}
		}
	}
	return out
}

// allocSpec allocates a persistent rdma segment of size bytes at d as an
// administrator with the redundancy text spec.
func allocSpec(ctx context.Context, t *testing.T, d *Daemon, size int64, spec string) (*record, error) {
	s, err := redspec.Parse(spec)
	require.NoError(t, err)
	return d.pool.Alloc(ctx, caller{}, allocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, Persist: true, Redundancy: &s})
}

// TestRedundantPlacement: on four in-process hosts in two zones, a
// replicated and an erasure-coded segment get one home per copy or shard
// on distinct hosts, in distinct zones while there are as many, each an
// rdma segment of the shard's size that its host holds for the origin
// (the origin's own memory counting as a host); the size of an erasure
// coded segment is padded to whole stripes. Too few hosts is
// ErrNoCapacity naming how many it needs and has, unless or-fewer, which
// places fewer and says so. A load/store tier is refused. Free frees every
// home. A placement that fails on one host (crashed, not yet known dead)
// leaves nothing behind on the others.
func TestRedundantPlacement(t *testing.T) {
	sc := redundantCluster(t, 4, nil, false)
	ctx := t.Context()
	origin := sc.hosts[0].daemon()
	zoneOf := map[string]string{}
	for _, h := range sc.hosts {
		zoneOf[h.name] = h.cfg.Zone
	}
	check := func(r *record, homes int, shard int64) {
		t.Helper()
		require.Len(t, r.Homes, homes)
		var nodes, zones []string
		for _, h := range r.Homes {
			require.Equal(t, poolv1.HomeState_HOME_STATE_OK, h.State)
			nodes = append(nodes, h.Node)
			zones = append(zones, zoneOf[h.Node])
			held, err := sc.host(h.Node).daemon().pool.Stat(h.HomeID)
			require.NoError(t, err, "home %s holds the copy", h.Node)
			require.Equal(t, shard, held.Size)
			require.Equal(t, peerClientPrefix+origin.cfg.Node, held.Owner)
		}
		require.Len(t, slices.Compact(slices.Sorted(slices.Values(nodes))), homes, "distinct hosts: %v", nodes)
		require.Len(t, slices.Compact(slices.Sorted(slices.Values(zones[:2]))), 2, "the first two homes in distinct zones: %v", zones)
		require.Equal(t, r.Homes[0].Node, r.Home, "the single-home fields name the first home")
		require.Equal(t, r.Homes[0].HomeID, r.HomeID)
	}

	rep, err := allocSpec(ctx, t, origin, 10000, "replicas=2")
	require.NoError(t, err)
	check(rep, 2, 10000)
	require.Equal(t, redundancy{Replicas: 2}, rep.Redundancy)

	ec, err := allocSpec(ctx, t, origin, 10000, "ec=2+1")
	require.NoError(t, err)
	check(ec, 3, 2*shardChunk)
	require.Equal(t, int64(2*2*shardChunk), ec.Size, "padded to whole stripes")
	require.Equal(t, int64(shardChunk), ec.ShardChunk)

	_, err = allocSpec(ctx, t, origin, 10000, "replicas=5")
	require.ErrorIs(t, err, errs.ErrNoCapacity)
	require.ErrorContains(t, err, "needs 5 distinct hosts")
	require.ErrorContains(t, err, "4 have them")
	_, err = allocSpec(ctx, t, origin, 10000, "ec=4+2,or-fewer")
	require.ErrorIs(t, err, errs.ErrNoCapacity, "k data shards and one parity need k+1 hosts")
	require.ErrorContains(t, err, "needs 5 distinct hosts")

	fewer, err := allocSpec(ctx, t, origin, 10000, "replicas=5,or-fewer")
	require.NoError(t, err)
	check(fewer, 4, 10000)
	require.Equal(t, redundancy{Replicas: 4, Fallback: true}, fewer.Redundancy, "the segment says what it got")
	fewerEC, err := allocSpec(ctx, t, origin, 10000, "ec=2+3,or-fewer")
	require.NoError(t, err)
	check(fewerEC, 4, 2*shardChunk)
	require.Equal(t, redundancy{Data: 2, Parity: 2, Fallback: true}, fewerEC.Redundancy)

	s := redspec.Spec{Replicas: 2}
	_, err = origin.pool.Alloc(ctx, caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true, Redundancy: &s})
	require.ErrorIs(t, err, errs.ErrInvalid)
	require.ErrorContains(t, err, "mapped into its applications")

	for _, r := range []*record{rep, ec, fewer, fewerEC} {
		require.NoError(t, origin.pool.Free(caller{}, r.ID, ""))
	}
	require.Eventually(t, func() bool { return len(sc.heldFor(origin.cfg.Node)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"every home is freed: %v", sc.heldFor(origin.cfg.Node))

	// A host that crashed a moment ago is still alive to gossip (seconds
	// of the lan profile's failure detection): the placement on it fails,
	// and the homes made on the others go.
	sc.crash(sc.hosts[3])
	_, err = allocSpec(ctx, t, origin, 10000, "replicas=4")
	require.Error(t, err)
	require.NotErrorIs(t, err, errs.ErrNoCapacity, "placed on the crashed host, not refused for want of hosts")
	require.Eventually(t, func() bool { return len(sc.heldFor(origin.cfg.Node)) == 0 }, 10*time.Second, 20*time.Millisecond,
		"a failed placement leaves no home behind: %v", sc.heldFor(origin.cfg.Node))
	for _, r := range origin.pool.List() {
		require.False(t, r.redundant(), "no record of the failed placement: %+v", r)
	}
}

// homeConn dials the data plane of home h of r with the origin's own
// credential there (the origin owns every copy).
func homeConn(t *testing.T, origin *Daemon, h homeRef) rdma.Conn {
	pc, err := origin.pool.homeSession(t.Context(), h.Node, "home")
	require.NoError(t, err, "a session with %s", h.Node)
	c, err := dialHome(t.Context(), h.Node, h.DataAddr, false, nil, pc.DataCredential())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestRedundantFailover: a backup that fails a forwarded write is marked
// lost at the origin (HomeFailed) before the write is answered. A client's write to the primary of a replicas=2
// segment is on the backup when it is answered, the client may read the
// backup but not write it (nor may another daemon than the origin say who
// writes it), and one to a data shard of an
// ec=2+1 segment changes the parity shard by its Reed-Solomon delta. When
// the primary's host crashes, the origin marks that home lost, promotes
// the backup under the next epoch (the origin lends no memory itself, so
// no crash takes it); when that host returns with its copy, the copy is
// freed there and the home stays lost. A new home placed in its place
// (placeHome, updateRecord, replicate: what a rebuild uses) takes the
// primary's forwarded writes at the promoted epoch. (the single-home fields name it) and
// the segment is degraded; the data is there. When the backup's host
// crashes too, the segment is lost.
func TestRedundantFailover(t *testing.T) {
	sc, origin, app, rep := replicatedForApp(t)
	ctx := t.Context()
	primary, backup := rep.Homes[0], rep.Homes[1]
	// The client, with the credentials its daemon's peers delegated to it.
	appConn := func(h homeRef) rdma.Conn {
		c, err := dialHome(ctx, h.Node, h.DataAddr, false, nil, origin.delegatedCred(ctx, h.Node, "app"))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	want := []byte("written through the primary")
	require.NoError(t, appConn(primary).Write(ctx, homeRegion(primary), 100, want))
	got := make([]byte, len(want))
	require.NoError(t, appConn(backup).Read(ctx, homeRegion(backup), 100, got))
	require.Equal(t, want, got, "the backup holds the write once the primary answered it")
	require.ErrorIs(t, appConn(backup).Write(ctx, homeRegion(backup), 0, []byte("x")), rdma.ErrAccessDenied, "the client only reads the backup")
	// Only the daemon that placed a copy sets how it is replicated.
	other := sc.host(primary.Node).daemon()
	pc, err := other.pool.homeSession(ctx, backup.Node, "home")
	require.NoError(t, err)
	_, err = callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.ReplicateResponse, error) {
		return api.Replicate(ctx, &poolv1.ReplicateRequest{HomeId: backup.HomeID, Epoch: backup.Epoch, Writers: []string{other.cfg.Node}})
	})
	require.ErrorIs(t, err, errs.ErrAccessDenied)

	// A backup that stops taking forwarded writes (freed at its host) is
	// reported by the primary and marked lost; the client's write is
	// answered all the same.
	rep2, err := origin.pool.Alloc(ctx, app, allocRequest{Size: 8192, Tier: poolv1.Tier_TIER_RDMA, Redundancy: &redspec.Spec{Replicas: 2}})
	require.NoError(t, err)
	gone := rep2.Homes[1]
	require.NoError(t, sc.host(gone.Node).daemon().pool.Free(caller{}, gone.HomeID, ""))
	require.NoError(t, appConn(rep2.Homes[0]).Write(ctx, homeRegion(rep2.Homes[0]), 0, []byte("forward fails")))
	now, err := origin.pool.Stat(rep2.ID)
	require.NoError(t, err)
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, now.Homes[1].State, "the write was answered once the origin had marked the failed target lost")
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, now.redundancyState())
	require.Equal(t, rep2.Home, now.Home, "the primary stays")
	require.Equal(t, 1.0, segmentsGauge(t, origin, "degraded"), "farmem_segments{state=\"degraded\"}")

	ec, err := allocSpec(ctx, t, origin, 2*shardChunk, "ec=2+1")
	require.NoError(t, err)
	d0, d1, parity := ec.Homes[0], ec.Homes[1], ec.Homes[2]
	require.NoError(t, homeConn(t, origin, d0).Write(ctx, homeRegion(d0), 10, []byte{0x0f, 0xf0}))
	require.NoError(t, homeConn(t, origin, d1).Write(ctx, homeRegion(d1), 10, []byte{0x33, 0x33}))
	enc, err := reedsolomon.New(2, 1)
	require.NoError(t, err)
	shards := [][]byte{make([]byte, 2), make([]byte, 2), make([]byte, 2)}
	shards[0], shards[1] = []byte{0x0f, 0xf0}, []byte{0x33, 0x33}
	require.NoError(t, enc.Encode(shards))
	got = make([]byte, 2)
	require.NoError(t, homeConn(t, origin, parity).Read(ctx, homeRegion(parity), 10, got))
	require.Equal(t, shards[2], got, "the parity shard holds the data shards' parity")

	sc.crash(sc.host(primary.Node))
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && now.Home == backup.Node
	}, 30*time.Second, 20*time.Millisecond, "the backup is promoted")
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, now.redundancyState())
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, now.Homes[1].State, "the old primary is lost")
	require.Equal(t, rep.Epoch+1, now.Epoch)
	require.False(t, now.Lost)
	promoted := now.Homes[0]
	got = make([]byte, len(want))
	require.NoError(t, homeConn(t, origin, promoted).Read(ctx, homeRegion(promoted), 100, got))
	require.Equal(t, want, got)
	require.NoError(t, homeConn(t, origin, promoted).Write(ctx, homeRegion(promoted), 0, []byte("new primary")), "the promoted copy takes writes at its new epoch")

	// The old primary's host returns with its copy: the copy is freed
	// there, never taken back. (A copy of rep2 there, if its primary was,
	// was its last OK one: kept, and served again now.)
	old := sc.host(primary.Node)
	sc.net.Heal()
	require.NoError(t, sc.start(old))
	require.Eventually(t, func() bool { return !slices.Contains(sc.heldFor(origin.cfg.Node)[old.name], primary.HomeID) }, 30*time.Second, 20*time.Millisecond,
		"the returned host still holds the lost copy: %v", sc.heldFor(origin.cfg.Node))
	now, err = origin.pool.Stat(rep.ID)
	require.NoError(t, err)
	require.Equal(t, promoted.Node, now.Home)
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, now.Homes[1].State, "a lost home stays lost")

	// What a rebuild builds on: a new home in the lost one's place,
	// committed REBUILDING, and the homes told again; it is raised to the
	// promoted epoch and the primary forwards to it.
	fresh, placed, err := origin.pool.placeHome(ctx, &now, nil)
	require.NoError(t, err)
	require.NotEqual(t, promoted.Node, fresh.Node)
	require.Equal(t, poolv1.HomeState_HOME_STATE_REBUILDING, fresh.State)
	now, err = origin.pool.updateRecord(rep.ID, func(r *record) error { r.Homes[1] = fresh; return nil })
	require.NoError(t, err)
	placed()
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING, now.redundancyState())
	// Retried as replicateLater does: the new home may be the returned
	// host, which the primary's session from before its restart no
	// longer reaches until it reconnects.
	require.Eventually(t, func() bool {
		if err = origin.pool.replicate(ctx, &now); err != nil {
			t.Logf("replicate: %v", err)
		}
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the homes are told how to forward")
	now, err = origin.pool.Stat(rep.ID)
	require.NoError(t, err)
	require.Equal(t, now.Epoch, now.Homes[1].Epoch, "the new home holds the segment's epoch")
	require.NoError(t, homeConn(t, origin, now.Homes[0]).Write(ctx, homeRegion(now.Homes[0]), 200, []byte("forwarded to the new home")))
	got = make([]byte, 25)
	require.NoError(t, homeConn(t, origin, now.Homes[1]).Read(ctx, homeRegion(now.Homes[1]), 200, got))
	require.Equal(t, "forwarded to the new home", string(got))
	now, err = origin.pool.updateRecord(rep.ID, func(r *record) error { r.Homes[1].State = poolv1.HomeState_HOME_STATE_OK; return nil })
	require.NoError(t, err)
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_OK, now.redundancyState())

	sc.crash(sc.host(now.Homes[0].Node))
	sc.crash(sc.host(now.Homes[1].Node))
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && now.Lost
	}, 30*time.Second, 20*time.Millisecond, "with both copies gone the segment is lost")
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_LOST, now.redundancyState())
}

// segmentsGauge is d's farmem_segments sample for the rdma tier in state.
func segmentsGauge(t *testing.T, d *Daemon, state string) float64 {
	fams, err := d.metrics.reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "farmem_segments" {
			continue
		}
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["tier"] == "rdma" && labels["state"] == state {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no farmem_segments sample for tier rdma, state %s", state)
	return 0
}

// TestLastCopyKeptAcrossPartition: a partition cuts the origin off from
// both homes of a replicas=2 segment. The origin marks the first home it
// hears dead lost (its copy is freed) and the second, whose loss leaves
// the segment lost, UNREACHABLE: it held every acknowledged write, so it
// is kept at its host, not freed. When the partition heals, that home is
// OK again, the primary (promoted if it was the backup), and the segment
// is served again, degraded, with its bytes; the other copy stays freed.
// A kept copy reported to have missed a forwarded write is lost instead.
func TestLastCopyKeptAcrossPartition(t *testing.T) {
	sc := redundantCluster(t, 4, fastDetection, true)
	ctx := t.Context()
	origin := sc.hosts[0].daemon()
	rep, err := allocSpec(ctx, t, origin, 8192, "replicas=2")
	require.NoError(t, err)
	missed, err := allocSpec(ctx, t, origin, 8192, "replicas=2")
	require.NoError(t, err)
	want := []byte("acknowledged before the partition")
	require.NoError(t, homeConn(t, origin, rep.Homes[0]).Write(ctx, homeRegion(rep.Homes[0]), 64, want))

	sc.partition(sc.hosts[:1], sc.hosts[1:])
	var now record
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && now.Lost
	}, 30*time.Second, 20*time.Millisecond, "the origin marks the segment lost")
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_LOST, now.redundancyState())
	require.Equal(t, 1, now.homesIn(poolv1.HomeState_HOME_STATE_LOST), "the first home lost: %+v", now.Homes)
	require.Equal(t, 1, now.homesIn(poolv1.HomeState_HOME_STATE_UNREACHABLE), "the last one kept: %+v", now.Homes)
	kept := now.Homes[slices.IndexFunc(now.Homes, func(h homeRef) bool { return h.State == poolv1.HomeState_HOME_STATE_UNREACHABLE })]
	gone := now.Homes[slices.IndexFunc(now.Homes, func(h homeRef) bool { return h.State == poolv1.HomeState_HOME_STATE_LOST })]
	require.Contains(t, sc.heldFor(origin.cfg.Node)[kept.Node], kept.HomeID, "the kept copy is not freed")
	// A kept copy that then misses a write (a home reports it could not
	// forward to it) is lost after all: it is never restored.
	var m record
	require.Eventually(t, func() bool {
		m, err = origin.pool.Stat(missed.ID)
		return err == nil && m.homesIn(poolv1.HomeState_HOME_STATE_UNREACHABLE) == 1
	}, 30*time.Second, 20*time.Millisecond)
	mk := m.Homes[slices.IndexFunc(m.Homes, func(h homeRef) bool { return h.State == poolv1.HomeState_HOME_STATE_UNREACHABLE })]
	origin.pool.homeLost(missed.ID, mk.Node, mk.HomeID, "a forward to it failed", true)
	m, err = origin.pool.Stat(missed.ID)
	require.NoError(t, err)
	require.Equal(t, 2, m.homesIn(poolv1.HomeState_HOME_STATE_LOST), "%+v", m.Homes)

	sc.net.Heal()
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && !now.Lost
	}, 30*time.Second, 20*time.Millisecond, "the segment is served again once its kept home returns")
	require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, now.redundancyState())
	require.Equal(t, kept.Node, now.Home, "the kept copy is the primary")
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, now.Homes[0].State)
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, now.Homes[1].State)
	got := make([]byte, len(want))
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && homeConn(t, origin, now.Homes[0]).Read(ctx, homeRegion(now.Homes[0]), 64, got) == nil
	}, 30*time.Second, 50*time.Millisecond, "the primary serves its copy at the segment's epoch")
	require.Equal(t, want, got, "the acknowledged write is there")
	require.NoError(t, homeConn(t, origin, now.Homes[0]).Write(ctx, homeRegion(now.Homes[0]), 0, []byte("after the heal")), "and it takes writes")
	require.Eventually(t, func() bool { return !slices.Contains(sc.heldFor(origin.cfg.Node)[gone.Node], gone.HomeID) }, 30*time.Second, 20*time.Millisecond,
		"the first home's copy, which missed writes, is freed")
	m, err = origin.pool.Stat(missed.ID)
	require.NoError(t, err)
	require.True(t, m.Lost, "the segment whose kept copy missed a write stays lost")
}

// TestReturnJudgedAfterDeath: a node's return that begins while its death
// is still marking its homes is judged after that marking, so the copy
// the death kept (the segment's last) is restored. The death is held
// inside its judgment until the return has finished or two seconds have
// passed: judged concurrently, the return finished first, looked for kept
// homes before there were any, and the copy stayed unreachable (the
// segment lost) although its node was back holding it.
func TestReturnJudgedAfterDeath(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	var hold atomic.Pointer[func(node string, up bool)]
	for _, h := range sc.hosts {
		h.cfg.Rebuild = false
	}
	sc.hosts[0].cfg.ExportSize = 0
	sc.hosts[0].cfg.sim.judging = func(node string, up bool) {
		if f := hold.Load(); f != nil {
			(*f)(node, up)
		}
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()
	origin := sc.hosts[0].daemon()
	rep, err := allocSpec(ctx, t, origin, 8192, "replicas=2")
	require.NoError(t, err)
	keep, other := rep.Homes[0], rep.Homes[1]

	// The other copy's node is judged dead first: keep's copy is the last.
	origin.pool.homeChanged(other.Node, false)
	now, err := origin.pool.Stat(rep.ID)
	require.NoError(t, err)
	require.False(t, now.Lost)
	require.Equal(t, 1, now.homesIn(poolv1.HomeState_HOME_STATE_LOST), "%+v", now.Homes)

	marking, returned := make(chan struct{}), make(chan struct{})
	f := func(node string, up bool) {
		if node != keep.Node || up {
			return
		}
		close(marking)
		select {
		case <-returned:
		case <-time.After(2 * time.Second):
		}
	}
	hold.Store(&f)
	died := make(chan struct{})
	go func() {
		defer close(died)
		origin.pool.homeChanged(keep.Node, false)
	}()
	<-marking
	go func() {
		defer close(returned)
		origin.pool.homeChanged(keep.Node, true)
	}()
	<-died
	<-returned
	hold.Store(nil)

	now, err = origin.pool.Stat(rep.ID)
	require.NoError(t, err)
	require.False(t, now.Lost, "the kept copy's node returned holding it: %+v", now.Homes)
	require.Equal(t, keep.Node, now.Home)
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, now.Homes[0].State, "%+v", now.Homes)
	require.Contains(t, sc.heldFor(origin.cfg.Node)[keep.Node], keep.HomeID, "the kept copy is not freed")
}

// TestRetryAtRebuiltHomeIndeterminate: a rebuild fills a replicas=2
// segment's new backup by copying the primary's memory, which holds an add
// whose answer the client never had; the backup has no answer for it. Once
// another add of the client's session (another slot) is forwarded there,
// the backup holds the session with its slots known, and when the primary
// dies and the backup is promoted, the client's retry of the first add
// with its ticket must not run again: it is ErrIndeterminate and the word
// holds one add. A retry on the other slot, which ran an op there since
// the switch, still runs.
func TestRetryAtRebuiltHomeIndeterminate(t *testing.T) {
	sc, origin, _, rep := replicatedForApp(t)
	ctx := t.Context()
	primary, backup := rep.Homes[0], rep.Homes[1]
	sess := rdma.NewSession()
	appConn := func(h homeRef) rdma.Conn {
		c, err := tcp.Dial(ctx, h.DataAddr, tcp.WithCredential(origin.delegatedCred(ctx, h.Node, "app")), tcp.WithSession(sess), tcp.WithConns(1))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	atPrimary := appConn(primary)
	lost := &rdma.Op{Kind: rdma.OpFetchAdd, Region: homeRegion(primary), Delta: 1}
	tk, err := sess.Acquire(ctx)
	require.NoError(t, err)
	defer tk.Release()
	lost.Once = tk
	require.NoError(t, atPrimary.Do(ctx, lost)) // its answer is taken for lost

	// The backup's host dies; a rebuild places a new backup and fills it
	// from the primary.
	sc.crash(sc.host(backup.Node))
	var now record
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && now.Homes[1].State == poolv1.HomeState_HOME_STATE_LOST
	}, 30*time.Second, 20*time.Millisecond, "the backup is marked lost")
	// The origin's own reaction to the loss (replicate, then unsealing
	// the writers) holds the segment's move lock for a moment: the rebuild
	// waits for it (errRebuildBusy), as the rebuilder does.
	require.Eventually(t, func() bool {
		_, err = newRebuilder(origin.pool, 0).rebuild(ctx, rebuildWork{id: rep.ID, home: 1})
		return !errors.Is(err, errRebuildBusy)
	}, 30*time.Second, 20*time.Millisecond, "the segment stays busy")
	require.NoError(t, err)
	now, err = origin.pool.Stat(rep.ID)
	require.NoError(t, err)
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, now.Homes[1].State)
	spare := now.Homes[1]

	// Another add of the session, on another slot, is forwarded to it.
	tk2, err := sess.Acquire(ctx)
	require.NoError(t, err)
	require.NotEqual(t, tk.Slot, tk2.Slot)
	other := &rdma.Op{Kind: rdma.OpFetchAdd, Region: homeRegion(now.Homes[0]), Offset: 8, Delta: 1, Once: tk2}
	require.NoError(t, atPrimary.Do(ctx, other))
	tk2.Release()

	// The primary dies; the new backup is promoted; the client retries.
	sc.crash(sc.host(primary.Node))
	require.Eventually(t, func() bool {
		now, err = origin.pool.Stat(rep.ID)
		return err == nil && now.Home == spare.Node
	}, 30*time.Second, 20*time.Millisecond, "the rebuilt backup is promoted")
	promoted := now.Homes[0]
	lost.Region, lost.Prev = homeRegion(promoted), 0
	err = appConn(promoted).Do(ctx, lost)
	require.ErrorIs(t, err, rdma.ErrIndeterminate, "the retried add ran again at the rebuilt home (prev %d)", lost.Prev)
	got := make([]byte, 16)
	require.NoError(t, homeConn(t, origin, promoted).Read(ctx, homeRegion(promoted), 0, got))
	require.EqualValues(t, 1, binary.LittleEndian.Uint64(got), "the add is applied once")

	// The other slot ran an op there after the rebuild's switch joined the
	// copy (not moved later by the promotion): the retry of its next add,
	// which never reached the old primary, runs.
	var next *rdma.Ticket
	for next == nil {
		tk3, ok := sess.TryAcquire()
		require.True(t, ok)
		defer tk3.Release()
		if tk3.Slot == tk2.Slot {
			next = tk3
		}
	}
	next.Post() // sent to the old primary, which never had it
	// The promoted home takes clients' writes once the origin's replicate
	// after the promotion told it it is the primary (a retry's
	// INDETERMINATE above is answered before that check): wait until it
	// takes a write of the bytes it holds.
	pc := appConn(promoted)
	require.Eventually(t, func() bool {
		return pc.Read(ctx, homeRegion(promoted), 0, got) == nil && pc.Write(ctx, homeRegion(promoted), 0, got) == nil
	}, 30*time.Second, 20*time.Millisecond, "the promoted home never took the client's writes")
	again := &rdma.Op{Kind: rdma.OpFetchAdd, Region: homeRegion(promoted), Offset: 8, Delta: 1, Once: next}
	require.NoError(t, pc.Do(ctx, again))
	require.EqualValues(t, 1, again.Prev)
	require.NoError(t, homeConn(t, origin, promoted).Read(ctx, homeRegion(promoted), 0, got))
	require.EqualValues(t, 2, binary.LittleEndian.Uint64(got[8:]))
}

// replicatedForApp starts 4 simulated hosts with fast failure detection
// and places an 8 KiB replicas=2 segment for the client "app" (uid 1000,
// whose caller it returns) of the first, the origin.
func replicatedForApp(t *testing.T) (*simCluster, *Daemon, caller, *record) {
	sc := redundantCluster(t, 4, fastDetection, true)
	origin := sc.hosts[0].daemon()
	require.NoError(t, origin.pool.credentials().bind("app", uidIdentity(1000)))
	origin.pool.openSession("s-app", "app", "", "app", 1, 1000)
	app, err := origin.pool.callerFor("s-app")
	require.NoError(t, err)
	s := redspec.Spec{Replicas: 2}
	rep, err := origin.pool.Alloc(t.Context(), app, allocRequest{Size: 8192, Tier: poolv1.Tier_TIER_RDMA, Redundancy: &s})
	require.NoError(t, err)
	return sc, origin, app, rep
}
