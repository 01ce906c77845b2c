package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/device"
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

// TestUnplaceAfterHotplug: an allocation whose commit fails gives back
// what it took, and no more, when its device went away while it ran and
// came back under the same name (a new device, with an allocator of its
// own where another segment took the same extent meanwhile): the name is
// free again, the owner's usage back, and the other segment's extent is
// still taken.
func TestUnplaceAfterHotplug(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	var d *dev
	for _, x := range p.devs {
		if x.tier == poolv1.Tier_TIER_CXL {
			d = x
		}
	}
	require.NotNil(t, d, "an emulated cxl device")
	orig := d.Device
	back := &dev{Device: orig, tier: d.tier, usable: true}
	var other int64 = -1
	const n = 1 << 20
	d.Device = &createHook{Device: orig, hook: func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.dropLocked(d)
		var err error
		back.ext, err = extent.New(orig.Capacity(), orig.Align())
		require.NoError(t, err)
		p.addLocked(back)
		other, err = back.ext.Alloc(n)
		require.NoError(t, err)
		// The commit that follows fails.
		require.NoError(t, p.st.db.Close())
	}}
	t.Cleanup(func() {
		delete(p.gone, d.Name()) // orig is closed once, as back's
		require.NoError(t, p.close())
	})
	p.openSession("s-a", "app", "app", 1, 0)
	c, err := p.callerFor("s-a")
	require.NoError(t, err)
	_, err = p.Alloc(t.Context(), c, allocRequest{Size: n, Tier: poolv1.Tier_TIER_CXL, Name: "x"})
	require.ErrorContains(t, err, "commit to the metadata store")
	require.Zero(t, other, "the other segment took the extent the failed one had")
	require.Equal(t, int64(n), back.ext.Stats().Used, "the other segment's extent is still taken")
	_, ok := p.names["x"]
	require.False(t, ok, "the name is free again")
	segs, bytes := p.usage.of([]string{c.id()}, tierName(poolv1.Tier_TIER_CXL))
	require.Equal(t, []int64{0, 0}, []int64{int64(segs), bytes}, "the owner's usage is back")
}
