// This file holds hotplug: the kernel's device events followed, coalesced
// into rescans of the host's memory devices, and the devices that appeared
// or went away applied to the device list and the segment table.

package pool

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/cxl"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/extent"
	"github.com/farmem/farmem/internal/uevent"
)

// ueventSource is where the daemon hears the kernel's device events: the
// netlink socket, or a test's feed (simHooks.uevents). Receive blocks for
// one datagram; Close makes a blocked Receive return an error.
type ueventSource interface {
	Receive(buf []byte) (int, error)
	Close() error
}

var _ ueventSource = (*uevent.Socket)(nil)

// hotplugSubsystems are the subsystems whose events can change the memory
// devices: CXL regions and decoders (cxl), DAX devices and their drivers
// (dax), memory blocks going online or offline (memory), NUMA nodes coming
// and going (node).
var hotplugSubsystems = map[string]bool{"cxl": true, "dax": true, "memory": true, "node": true}

const (
	// rescanDelay is how long events are gathered before one rescan: a
	// region's creation is dozens of events, onlining a large device
	// hundreds, and one rescan after the burst sees the end state.
	rescanDelay = 200 * time.Millisecond
	// rescanRetries bounds the rescans made, rescanDelay apart, while the
	// tree reads with problems (a device half created or half removed when
	// it was read) and no further event comes.
	rescanRetries = 5
)

// followDevices listens for the kernel's device events until the daemon
// stops, and rescans the devices after each burst. Without a source (not
// Linux, or the socket refused) it logs why and returns: the devices found
// at start stay what the daemon serves.
func (d *Daemon) followDevices() {
	open := d.cfg.sim.uevents
	if open == nil {
		open = func() (ueventSource, error) { return uevent.Listen() }
	}
	src, err := open()
	if err != nil {
		d.log.Warn("not following device events: CXL memory created or removed from now on is seen only after a restart", "err", err)
		return
	}
	kick := make(chan struct{}, 1)
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		d.readEvents(src, kick)
	}()
	go func() {
		defer d.wg.Done()
		defer src.Close() // ends readEvents
		d.coalesce(kick)
	}()
}

// readEvents passes a kick for every event of a memory subsystem, and for
// lost events, until src fails for good (closed).
func (d *Daemon) readEvents(src ueventSource, kick chan<- struct{}) {
	buf := make([]byte, uevent.MaxMessage)
	for {
		n, err := src.Receive(buf)
		if errors.Is(err, uevent.ErrOverflow) {
			d.log.Warn("device events lost (receive buffer overflowed); rescanning the devices", "err", err)
		} else if err != nil {
			select {
			case <-d.stop:
			default:
				d.log.Warn("not following device events any more: CXL memory created or removed from now on is seen only after a restart", "err", err)
			}
			return
		} else {
			ev, err := uevent.Parse(buf[:n])
			if err != nil {
				d.log.Debug("device event ignored", "err", err)
				continue
			}
			if !hotplugSubsystems[ev.Subsystem] {
				continue
			}
			d.log.Debug("device event", "action", ev.Action, "subsystem", ev.Subsystem, "devpath", ev.DevPath, "seqnum", ev.Seqnum)
		}
		select {
		case kick <- struct{}{}:
		default: // a rescan is pending already
		}
	}
}

// coalesce rescans rescanDelay after the first kick of a burst, so that a
// flood of events costs one rescan per rescanDelay; it rescans again while
// the tree reads with problems, up to rescanRetries times.
func (d *Daemon) coalesce(kick <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	retries, pending := 0, false
	for {
		select {
		case <-d.stop:
			return
		case <-kick:
			retries = 0
			if !pending { // never pushed back: events without end still rescan every rescanDelay
				pending = true
				timer.Reset(rescanDelay)
			}
		case <-timer.C:
			pending = false
			if d.rescan() && retries < rescanRetries {
				retries++
				pending = true
				timer.Reset(rescanDelay)
			}
		}
	}
}

// rescan reads the host's memory devices again and applies what changed.
// It reports whether the tree read with problems, so that the caller reads
// it again once it has settled.
func (d *Daemon) rescan() (unsettled bool) {
	fs, err := cxl.NewFS(d.cfg.SysfsRoot)
	var inv *cxl.Inventory
	if err == nil {
		inv, err = fs.Discover()
	}
	if err != nil {
		d.log.Warn("rescan of the memory devices failed; the devices stay as they were", "sysfs", d.cfg.SysfsRoot, "err", err)
		return true
	}
	for _, p := range inv.Problems {
		d.log.Debug("sysfs problem", "err", p)
	}
	d.inv.Store(inv)
	added, dropped := d.pool.syncDevices(inv)
	d.pool.setHMAT(inv)
	level := slog.LevelDebug // most events change nothing poold uses
	if added+dropped > 0 {
		level = slog.LevelInfo
	}
	d.log.Log(context.Background(), level, "memory devices rescanned", "added", added, "dropped", dropped, "problems", len(inv.Problems))
	if added+dropped > 0 && d.cfg.MeasureTiers {
		d.remeasure()
	}
	return len(inv.Problems) > 0
}

// remeasure measures the tiers again in the background, so that the
// figures placement goes by are those of the devices there now (a device
// that appeared is first in its tier, and measured). One measurement at a
// time; a change during one is measured again after it.
func (d *Daemon) remeasure() {
	r := &d.remeasuring
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		r.again = true
		return
	}
	r.running = true
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := untilClosed(context.Background(), d.stop)
		defer cancel()
		for {
			if err := d.pool.measureTiers(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("measure tiers after a device change", "err", err)
			}
			r.mu.Lock()
			if !r.again || ctx.Err() != nil {
				r.running = false
				r.mu.Unlock()
				return
			}
			r.again = false
			r.mu.Unlock()
		}
	}()
}

// remeasuring is the state of remeasure: whether a measurement runs, and
// whether a change came during it.
type remeasuring struct {
	mu             sync.Mutex
	running, again bool
}

// found is a CXL device discovery reported: its identity and how to open it.
type found struct {
	key       string // see devKey
	name      string
	usable    bool
	note      string
	powerSafe bool
	open      func() (device.Device, error)
}

// devKey identifies a discovered device across rescans: a devdax device by
// name, path and geometry (reconfigured to another size it is another
// device), a NUMA node by name (its free memory changes all the time).
// Other devices (emulated, local, export) are the daemon's own: "".
func devKey(d device.Device) string {
	switch dd := d.(type) {
	case *device.Devdax:
		return devdaxKey(dd.Name(), dd.Path(), dd.Capacity(), dd.Align())
	case *device.NUMA:
		return "numa " + dd.Name()
	}
	return ""
}

func devdaxKey(name, path string, size, align int64) string {
	return "devdax " + name + " " + path + " " + strconv.FormatInt(size, 10) + " " + strconv.FormatInt(align, 10)
}

// wanted lists the CXL devices inv shows, as discover would open them.
func (p *core) wanted(inv *cxl.Inventory) []found {
	var out []found
	for _, dx := range inv.DevdaxDevices() {
		key := devdaxKey(dx.Name, devPath(p.cfg, dx), int64(dx.Size), devdaxAlign(dx))
		out = append(out, found{key: key, name: dx.Name, usable: p.cfg.AllowDevdaxFD, note: devdaxNote(p.cfg, dx.Name), powerSafe: dx.Persistent,
			open: func() (device.Device, error) { return openDevdax(p.cfg, dx, p.log) }})
	}
	for _, n := range inv.FarNodes() {
		name := "node" + strconv.Itoa(n.ID)
		out = append(out, found{key: "numa " + name, name: name, usable: true,
			open: func() (device.Device, error) { return openNUMA(p.cfg, n, p.log) }})
	}
	return out
}

// syncDevices makes the device list match inv: devices gone from it stop
// taking placements and their segments are lost (their owners told); new
// ones are opened and placed on, ahead of the emulated device. A device
// that cannot be opened is logged and left out, as at start.
// It returns how many devices were added and dropped.
func (p *core) syncDevices(inv *cxl.Inventory) (added, dropped int) {
	want := p.wanted(inv)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, 0
	}
	have := map[string]bool{}
	var gone []*dev
	for _, d := range p.devs {
		key := devKey(d.Device)
		if key == "" {
			continue
		}
		if slices.ContainsFunc(want, func(f found) bool { return f.key == key }) {
			have[key] = true
		} else {
			gone = append(gone, d)
		}
	}
	for _, d := range gone {
		p.dropLocked(d)
	}
	// A device that comes back under a name that went before: the old one
	// is closed first (a NUMA node's directory is locked by it).
	var stale []*dev
	var add []found
	for _, f := range want {
		if have[f.key] {
			continue
		}
		add = append(add, f)
		if g := p.gone[f.name]; g != nil {
			stale = append(stale, g)
			delete(p.gone, f.name)
		}
	}
	p.mu.Unlock()
	for _, d := range stale {
		if err := d.Close(); err != nil {
			p.log.Warn("close a device that went away", "device", d.Name(), "err", err)
		}
	}
	var opened []*dev
	for _, f := range add {
		dd, err := f.open()
		if err != nil {
			continue // logged by open
		}
		ext, err := extent.New(dd.Capacity(), dd.Align())
		if err != nil {
			p.log.Warn("device found but not usable", "device", dd.Name(), "err", err)
			dd.Close()
			continue
		}
		opened = append(opened, &dev{Device: dd, tier: poolv1.Tier_TIER_CXL, ext: ext, usable: f.usable, note: f.note, powerSafe: f.powerSafe})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, d := range opened {
			d.Close()
		}
		return 0, len(gone)
	}
	for _, d := range opened {
		p.addLocked(d)
	}
	p.noteEmulatedLocked()
	return len(opened), len(gone)
}

// dropLocked takes a device that went away out of the list: no placement
// reaches it any more, its segments are lost (recorded, so that a device
// that comes back under its name does not bring them back with whatever
// its memory then holds) and their owners told. A devdax device is closed
// now, letting the kernel tear it down; a NUMA device stays open in
// p.gone until its name comes back, so that freeing its segments still
// removes their files.
func (p *core) dropLocked(d *dev) {
	p.devs = slices.DeleteFunc(slices.Clone(p.devs), func(x *dev) bool { return x == d })
	p.forgetFiguresLocked(d.tier)
	var lost []*record
	for _, r := range p.segs {
		if r.Home == "" && r.Device == d.Name() && !r.Lost {
			r.Lost = true
			lost = append(lost, r)
		}
	}
	if len(lost) > 0 {
		if err := p.st.put(lost...); err != nil {
			p.log.Error("record segments lost with their device", "device", d.Name(), "segments", len(lost), "err", err)
		}
	}
	p.notifyLocked(lostNotices(lost))
	p.log.Warn("device went away: no more placements on it, its segments are lost", "device", d.Name(), "kind", d.Kind(), "segments", len(lost))
	if d.Kind() == device.KindDevdax {
		if err := d.Close(); err != nil {
			p.log.Warn("close a device that went away", "device", d.Name(), "err", err)
		}
	}
	if p.gone == nil {
		p.gone = map[string]*dev{}
	}
	p.gone[d.Name()] = d
}

// lostNotices are the session notices of segments lost: each to its owner
// and every client that attached it.
func lostNotices(lost []*record) map[string]*poolv1.SegmentEvents {
	byOwner := map[string]*poolv1.SegmentEvents{}
	tell := func(client string, id uint64) {
		if byOwner[client] == nil {
			byOwner[client] = &poolv1.SegmentEvents{}
		}
		byOwner[client].Lost = appendIf(byOwner[client].Lost, id, true)
	}
	for _, r := range lost {
		tell(r.Owner, r.ID)
		for _, a := range r.Attached {
			tell(a, r.ID)
		}
	}
	return byOwner
}

// addLocked puts a device that appeared into the list, after the other
// discovered devices and ahead of the daemon's own (emulated, local,
// export), as discover orders them. Extents of segments recorded on a
// device of its name (lost when it went) stay reserved until freed, and so
// do the held extents of freed segments that processes still map
// (holdExtent), which are given back to this allocator when they end.
func (p *core) addLocked(d *dev) {
	for _, r := range p.segs {
		if r.Home == "" && r.Device == d.Name() {
			if err := d.ext.Reserve(r.Offset, r.Extent); err != nil {
				p.log.Warn("segment of a device that came back does not fit it", "segment", r.ID, "device", d.Name(), "err", err)
			}
		}
	}
	for _, h := range p.held {
		if h.device == d.Name() {
			if err := d.ext.Reserve(h.offset, h.extent); err != nil {
				p.log.Warn("held extent of a device that came back does not fit it", "segment", h.seg, "device", d.Name(), "err", err)
			}
		}
	}
	i := 0
	for i < len(p.devs) && devKey(p.devs[i].Device) != "" {
		i++
	}
	p.devs = slices.Insert(slices.Clone(p.devs), i, d)
	p.forgetFiguresLocked(d.tier)
	p.log.Info("device appeared: placing on it", "device", d.Name(), "kind", d.Kind(), "tier", tierName(d.tier), "capacity", d.Capacity(), "handed-out", d.usable)
}

// forgetFiguresLocked drops tier t's measured and firmware figures when its
// devices change: they may be a device's that went, or not the first
// device's any more. Placement then goes without them, as before the first
// measurement, until the tier is measured again (remeasure) and setHMAT
// reads the firmware's figures of the devices there now.
func (p *core) forgetFiguresLocked(t poolv1.Tier) {
	delete(p.measured, t)
	delete(p.hmat, t)
}

// noteEmulatedLocked keeps the emulated device's note true: it says
// whether real CXL memory is there beside it.
func (p *core) noteEmulatedLocked() {
	found := slices.ContainsFunc(p.devs, func(d *dev) bool { return devKey(d.Device) != "" })
	for _, d := range p.devs {
		if e, ok := d.Device.(*device.Emulated); ok && d.tier == poolv1.Tier_TIER_CXL {
			d.note = emulatedNote(e.Dir(), found)
		}
	}
}

// devPath is where a devdax device is opened.
func devPath(cfg Config, dx cxl.DaxDevice) string { return filepath.Join(cfg.DevRoot, dx.DevPath) }

// devdaxAlign is a devdax device's alignment: 2 MiB, the devdax default,
// on kernels before 5.10, which do not say.
func devdaxAlign(dx cxl.DaxDevice) int64 {
	if dx.Align == 0 {
		return 2 << 20
	}
	return int64(dx.Align)
}
