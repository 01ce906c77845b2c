package pool

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/extent"
)

// createHook is a device whose Create runs hook first, as a hotplug
// event arriving while an allocation reserves its backing without p.mu.
type createHook struct {
	device.Device
	hook func()
}

func (c *createHook) Create(id uint64, off, length int64) (device.Backing, error) {
	c.hook()
	return c.Device.Create(id, off, length)
}

// hotSwap is a pool with an emulated cxl device d and swap, which takes
// d away and brings it back under its name as back (a new device, with an
// allocator of its own), where another segment then takes n bytes at
// offset other; the pool is closed when the test ends.
type hotSwap struct {
	p     *core
	d     *dev
	back  *dev
	other int64
	c     caller
}

func newHotSwap(t *testing.T) *hotSwap {
	h := &hotSwap{p: newTestPool(t, testConfig(t)), other: -1}
	for _, x := range h.p.devs {
		if x.tier == poolv1.Tier_TIER_CXL {
			h.d = x
		}
	}
	require.NotNil(t, h.d, "an emulated cxl device")
	h.back = &dev{Device: h.d.Device, tier: h.d.tier, usable: true}
	t.Cleanup(func() { h.close(t) })
	h.p.openSession("s-a", "app", "", "app", 1, 0)
	var err error
	h.c, err = h.p.callerFor("s-a")
	require.NoError(t, err)
	return h
}

// close closes the pool; the device is closed once, as back's.
func (h *hotSwap) close(t *testing.T) {
	delete(h.p.gone, h.d.Name())
	require.NoError(t, h.p.close())
}

func (h *hotSwap) swap(t *testing.T, n int64) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	replaceDevLocked(t, h.p, h.d, h.back)
	var err error
	h.other, err = h.back.ext.Alloc(n)
	require.NoError(t, err)
}

// replaceDevLocked takes d away from p, as a hotplug removal does, and
// brings back in its place under its name, with an allocator of its own
// (nothing taken), as a device that came back. p.mu is held.
func replaceDevLocked(t *testing.T, p *core, d, back *dev) {
	p.dropLocked(d)
	var err error
	back.ext, err = extent.New(d.Capacity(), d.Align())
	require.NoError(t, err)
	p.addLocked(back)
}

// failed checks that an allocation of n bytes named x failed with err,
// naming why, and gave back what it took and no more: the other
// segment's extent at the same offset is still taken, the name is free,
// the owner's usage back, and no record is left.
func (h *hotSwap) failed(t *testing.T, err error, why string, n int64) {
	require.ErrorContains(t, err, why)
	require.Zero(t, h.other, "the other segment took the extent the failed one had")
	require.Equal(t, n, h.back.ext.Stats().Used, "the other segment's extent is still taken")
	_, ok := h.p.names["x"]
	require.False(t, ok, "the name is free again")
	segs, bytes := h.p.usage.of([]string{h.c.id()}, tierName(poolv1.Tier_TIER_CXL))
	require.Equal(t, []int64{0, 0}, []int64{int64(segs), bytes}, "the owner's usage is back")
	require.Empty(t, h.p.List(), "no record of the failed allocation")
}

// TestUnplaceAfterHotplug: an allocation whose device went away while it
// made the backing, and came back under the same name, fails (the next
// device may have room) rather than placing a segment on the old device,
// and gives back what it took and no more (hotSwap.failed); so does one
// whose commit fails after such a swap.
func TestUnplaceAfterHotplug(t *testing.T) {
	const n = 1 << 20
	for _, commitFails := range []bool{false, true} {
		h := newHotSwap(t)
		orig := h.d.Device
		h.d.Device = &createHook{Device: orig, hook: func() {
			h.swap(t, n)
			if commitFails {
				require.NoError(t, h.p.st.db.Close())
			}
		}}
		_, err := h.p.Alloc(t.Context(), h.c, allocRequest{Size: n, Tier: poolv1.Tier_TIER_CXL, Name: "x"})
		require.ErrorIs(t, err, errs.ErrNoCapacity)
		h.failed(t, err, "replaced during the allocation", n)
	}
}

// TestAllocDeviceReplacedDuringCommit: a device swapped while the
// allocation's record is being committed: the allocation fails, its
// record is deleted again, and it gives back what it took and no more.
func TestAllocDeviceReplacedDuringCommit(t *testing.T) {
	const n = 1 << 20
	h := newHotSwap(t)
	err := h.allocDuringSwap(t, n, func(*storeFile) {})
	require.ErrorIs(t, err, errDeviceChanged)
	h.failed(t, err, "replaced during the allocation", n)
	require.Empty(t, storedIDs(t, h.p), "the record is deleted from the store")
}

// allocDuringSwap allocates n bytes named x on h's device, swaps the
// device (hotSwap.swap) while the allocation's record commits, and calls
// armed with the store file of that record before the commit goes on; it
// returns the allocation's outcome.
func (h *hotSwap) allocDuringSwap(t *testing.T, n int64, armed func(*storeFile)) error {
	// A first allocation reserves a block of ids (a commit of its own).
	warm, err := h.p.Alloc(t.Context(), h.c, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL})
	require.NoError(t, err)
	require.NoError(t, h.p.Free(h.c, warm.ID, ""))
	f := h.p.st.fileFor(&record{Volatile: !h.d.powerSafe})
	release := holdCommit(f)
	done := make(chan error, 1)
	go func() {
		_, err := h.p.Alloc(t.Context(), h.c, allocRequest{Size: n, Tier: poolv1.Tier_TIER_CXL, Name: "x"})
		done <- err
	}()
	require.Eventually(t, queued(f, 1), 10*time.Second, time.Millisecond, "the allocation's commit does not wait")
	h.swap(t, n)
	armed(f)
	require.NoError(t, release())
	return <-done
}

// storedIDs are the ids of the segments p's store holds.
func storedIDs(t *testing.T, p *core) []uint64 {
	recs, _, _, err := p.st.load()
	require.NoError(t, err)
	var ids []uint64
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestUndoneAllocForgotten: an allocation undone after its record was
// committed (its device was swapped during the commit) whose record
// removal the store refuses once: the allocation fails as it would
// anyway, and the record goes all the same, by the background retry
// while the daemon runs, or before the store closes when it stops first:
// a restart serves and counts nothing of it.
func TestUndoneAllocForgotten(t *testing.T) {
	const n = 1 << 20
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "retried", true: "restart"}[restart], func(t *testing.T) {
			h := newHotSwap(t)
			var refused atomic.Int32
			err := h.allocDuringSwap(t, n, func(f *storeFile) {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.inject = func(removal bool) error {
					if removal && refused.CompareAndSwap(0, 1) {
						return errors.New("injected: the disk refused the write")
					}
					return nil
				}
			})
			require.ErrorIs(t, err, errDeviceChanged)
			h.failed(t, err, "replaced during the allocation", n)
			require.EqualValues(t, 1, refused.Load(), "the store refused the record's removal")
			if !restart {
				require.Eventually(t, func() bool { return len(storedIDs(t, h.p)) == 0 }, 30*time.Second, 10*time.Millisecond,
					"the record is removed by the retry")
				return
			}
			h.close(t)
			p := newTestPool(t, h.p.cfg)
			defer p.close()
			require.Empty(t, p.List(), "the restart serves no segment of the undone allocation")
			segs, bytes := p.usage.of([]string{h.c.id()}, tierName(poolv1.Tier_TIER_CXL))
			require.Equal(t, []int64{0, 0}, []int64{int64(segs), bytes}, "and counts none")
			require.Empty(t, storedIDs(t, p), "the record is gone from the store")
		})
	}
}
