package pool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/cxl"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/probe"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// Probe sizes: a span large enough to defeat the caches, and the least
// span worth probing. The probe takes at most a quarter of a device's
// largest free extent, so clients allocating meanwhile still find room.
const (
	probeSpan    = 64 * size.MiB
	probeMinSpan = 16 * size.MiB
	// probeSamples is the number of timed chunks per load/store chain and
	// of round trips per remote size: enough for a p99, short on 2 cores.
	probeSamples = 400
	// probeID is the segment id of the probe's temporary segments: far
	// above any id the pool hands out, and removed at start if a crash
	// left it behind (no record names it).
	probeID = math.MaxUint64 - 1
)

// measurement is what the probe found for one tier.
type measurement struct {
	read, write       *poolv1.Latency
	readBps, writeBps int64
}

func latency(r probe.Result) *poolv1.Latency {
	return &poolv1.Latency{P50Ns: r.P50.Nanoseconds(), P99Ns: r.P99.Nanoseconds(), Samples: int64(r.Samples), Source: "measured"}
}

// MeasureTiers measures every tier this daemon offers now (see
// Config.MeasureTiers), then, in a cluster, every alive peer's data plane
// (a peer being probed already is left to that probe), and records the
// results, which Tiers and memctl tiers then show with source "measured"
// ("measured: peer NODE" for peers). It returns when done or when ctx
// ends; a tier that cannot be measured keeps its previous figures, a peer
// shows why it is unmeasured. Measurements run one at a time; call it
// before Close.
func (d *Daemon) MeasureTiers(ctx context.Context) error {
	err := d.pool.measureTiers(ctx)
	d.pool.measurePeers(ctx)
	return err
}

// awaitFirstMeasure waits until the measurement of the tiers at start is
// done, or ctx ends: a budget judged before it finds no figure and refuses
// what a moment later fits.
func (p *core) awaitFirstMeasure(ctx context.Context) error {
	p.mu.Lock()
	first := p.firstMeasure
	p.mu.Unlock()
	if first == nil {
		return nil
	}
	select {
	case <-first:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("alloc with a read budget: poold is still measuring its tiers (it does so at start, for about 2 s) and the call's deadline came first; allow it longer: %w", ctx.Err())
	}
}

// measureTiers probes each load/store tier on a temporary segment of its
// first device with room, and the rdma tier through this daemon's own data
// plane (loopback).
func (p *core) measureTiers(ctx context.Context) error {
	p.probeMu.Lock()
	defer p.probeMu.Unlock()
	var errs []error
	done := map[poolv1.Tier]bool{}
	for _, dv := range p.devices() {
		if done[dv.tier] || ctx.Err() != nil {
			continue
		}
		start := time.Now()
		m, err := p.measureDevice(ctx, dv)
		if err != nil {
			errs = append(errs, fmt.Errorf("measure %s tier on %s: %w", tierName(dv.tier), dv.Name(), err))
			continue
		}
		if m == nil {
			continue
		}
		done[dv.tier] = true
		p.mu.Lock()
		if !slices.Contains(p.devs, dv) { // it went away meanwhile (hotplug.go)
			p.mu.Unlock()
			continue
		}
		if p.measured == nil {
			p.measured = map[poolv1.Tier]*measurement{}
		}
		p.measured[dv.tier] = m
		p.mu.Unlock()
		attrs := []any{"tier", tierName(dv.tier), "device", dv.Name(),
			"read-p50", time.Duration(m.read.P50Ns), "read-p99", time.Duration(m.read.P99Ns),
			"read-bandwidth-bps", m.readBps, "took", time.Since(start).Round(time.Millisecond)}
		if tg, ok := p.injected(dv.tier); ok {
			// The measurement is of the real memory; say what clients get.
			attrs = append(attrs, "injected", tg.String())
		}
		p.log.Info("measured tier", attrs...)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// measureDevice takes a temporary segment on dv, probes it and frees it.
// It returns nil, nil when dv has too little free space to be worth it.
func (p *core) measureDevice(ctx context.Context, dv *dev) (_ *measurement, err error) {
	remote := dv.tier == poolv1.Tier_TIER_RDMA
	if remote && p.dp == nil {
		return nil, nil
	}
	if !remote && !dv.usable {
		return nil, nil // e.g. devdax without --allow-devdax-fd: clients cannot use it either
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, nil
	}
	n := min(int64(probeSpan), dv.ext.Stats().LargestFree/4)
	n -= n % dv.Align()
	if n < int64(probeMinSpan) {
		p.mu.Unlock()
		return nil, nil
	}
	off, err := dv.ext.Alloc(n)
	p.mu.Unlock()
	if err != nil {
		return nil, nil // taken meanwhile
	}
	defer func() {
		err = errors.Join(err, dv.Remove(probeID, off, n))
		p.mu.Lock()
		err = errors.Join(err, dv.ext.Free(off, n))
		p.mu.Unlock()
	}()
	b, err := dv.Create(probeID, off, n)
	if err != nil {
		return nil, err
	}
	if remote {
		defer b.File.Close()
		return p.measureLoopback(ctx, b)
	}
	mp, err := device.Map(b)
	b.File.Close()
	if err != nil {
		return nil, err
	}
	defer mp.Close()
	return measureMemory(mp.Bytes())
}

// measureMemory runs the load/store probes on mem.
func measureMemory(mem []byte) (*measurement, error) {
	r, err := probe.LoadChain(mem, probeSamples)
	if err != nil {
		return nil, err
	}
	w, err := probe.StoreChain(mem, probeSamples)
	if err != nil {
		return nil, err
	}
	rb, err := probe.SeqRead(mem)
	if err != nil {
		return nil, err
	}
	wb, err := probe.SeqWrite(mem)
	if err != nil {
		return nil, err
	}
	return &measurement{read: latency(r), write: latency(w), readBps: rb, writeBps: wb}, nil
}

// measureLoopback exports b on the data plane under probeID and measures
// one-sided operations on it over TCP from this process.
func (p *core) measureLoopback(ctx context.Context, b device.Backing) (*measurement, error) {
	key, err := p.dp.export(probeID, b, 1, nil, false)
	if err != nil {
		return nil, err
	}
	defer p.dp.revoke(probeID)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := tcp.Dial(ctx, p.dp.addr, tcp.WithCredential(p.auth.self), tcp.WithTLS(p.dp.tls))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, err := probe.RemoteRead(ctx, conn, rdma.Region{Segment: probeID, Key: key, Epoch: 1}, b.Length, probeSamples/2, true)
	if err != nil {
		return nil, err
	}
	return &measurement{read: latency(r.Read64), write: latency(r.Write64), readBps: r.ReadBandwidth}, nil
}

// setHMAT records, per tier, the firmware's read latency of the NUMA node
// backing its first device that has one.
func (p *core) setHMAT(inv *cxl.Inventory) {
	if inv == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dv := range p.devs {
		if dv.Node() < 0 || p.hmat[dv.tier] != nil {
			continue
		}
		for _, n := range inv.Nodes {
			if n.ID == dv.Node() && n.HMAT != nil && n.HMAT.ReadLatency > 0 {
				if p.hmat == nil {
					p.hmat = map[poolv1.Tier]*poolv1.Latency{}
				}
				ns := n.HMAT.ReadLatency.Nanoseconds()
				p.hmat[dv.tier] = &poolv1.Latency{P50Ns: ns, P99Ns: ns, Source: "hmat"}
			}
		}
	}
}

// addMeasured fills ti's latency and bandwidth from what was measured and
// what the firmware reports. p.mu must be held.
func (p *core) addMeasured(ti *poolv1.TierInfo) {
	if m := p.measured[ti.Tier]; m != nil {
		ti.ReadLatency, ti.WriteLatency = m.read, m.write
		ti.ReadBandwidthBps, ti.WriteBandwidthBps = m.readBps, m.writeBps
	}
	ti.HmatReadLatency = p.hmat[ti.Tier]
	p.addInjected(ti)
}

// injected is the latency emulation of tier t (Config.EmulateLatency),
// false when there is none.
func (p *core) injected(t poolv1.Tier) (emulation.Target, bool) {
	tg, _ := p.cfg.EmulateLatency.Target(t)
	return tg, !tg.Zero()
}

func emulationProto(t emulation.Target) *poolv1.Emulation {
	return &poolv1.Emulation{LatencyNs: t.Latency.Nanoseconds(), BandwidthBps: t.Bandwidth}
}

// addInjected labels ti's latencies as injected when its tier has latency
// emulation, keeping what was measured of the real memory beside them:
// an injected figure is never shown as a measurement.
func (p *core) addInjected(ti *poolv1.TierInfo) {
	tg, ok := p.injected(ti.Tier)
	if !ok {
		return
	}
	ti.Injected = emulationProto(tg)
	ti.MeasuredReadLatency, ti.MeasuredWriteLatency = ti.ReadLatency, ti.WriteLatency
	ns := tg.Duration(64).Nanoseconds() // a 64-byte call, as measured tiers are
	ti.ReadLatency = &poolv1.Latency{P50Ns: ns, P99Ns: ns, Source: "injected"}
	ti.WriteLatency = &poolv1.Latency{P50Ns: ns, P99Ns: ns, Source: "injected"}
	note := fmt.Sprintf("latency injected by emulation (%s): clients' ReadAt, WriteAt and atomics take it; loads and stores through Bytes() are not slowed, and a call whose real cost is higher stays slower", tg)
	if ti.Note != "" {
		note = ti.Note + "; " + note
	}
	ti.Note = note
}
