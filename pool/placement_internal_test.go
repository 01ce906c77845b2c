package pool

import (
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
	t.Cleanup(func() {
		delete(h.p.gone, h.d.Name()) // the device is closed once, as back's
		require.NoError(t, h.p.close())
	})
	h.p.openSession("s-a", "app", "app", 1, 0)
	var err error
	h.c, err = h.p.callerFor("s-a")
	require.NoError(t, err)
	return h
}

func (h *hotSwap) swap(t *testing.T, n int64) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.p.dropLocked(h.d)
	var err error
	h.back.ext, err = extent.New(h.d.Capacity(), h.d.Align())
	require.NoError(t, err)
	h.p.addLocked(h.back)
	h.other, err = h.back.ext.Alloc(n)
	require.NoError(t, err)
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
	require.NoError(t, release())
	err = <-done
	require.ErrorIs(t, err, errDeviceChanged)
	h.failed(t, err, "replaced during the allocation", n)
	recs, _, _, err := h.p.st.load()
	require.NoError(t, err)
	require.Empty(t, recs, "the record is deleted from the store")
}
