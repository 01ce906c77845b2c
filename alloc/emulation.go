package alloc

import (
	"context"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/emulation"
)

// Injected is latency that emulation adds to a tier's calls: a call moving
// n bytes takes Latency + n/Bandwidth. The zero value injects nothing. A
// plain value.
type Injected struct {
	// Latency is the target duration of a call; 0 for none.
	Latency time.Duration
	// Bandwidth is in bytes per second; 0 means no cap.
	Bandwidth int64
}

func targetFromProto(e *poolv1.Emulation) emulation.Target {
	if e == nil {
		return emulation.Target{}
	}
	return emulation.Target{Latency: time.Duration(e.LatencyNs), Bandwidth: e.BandwidthBps}
}

// injected is the emulation target for a segment of tier t: this client's
// (WithEmulateLatency) where it names the tier, else the daemon's.
func (c *Client) injected(t poolv1.Tier, daemon *poolv1.Emulation) emulation.Target {
	if tg, named := c.emulate.Target(t); named {
		return tg
	}
	return targetFromProto(daemon)
}

// overrideTier shows a tier as this client experiences it: with the
// client's own emulation where it names the tier, labelled injected, and
// the daemon's measured figures beside it.
func (c *Client) overrideTier(ti TierInfo) TierInfo {
	tg, named := c.emulate.Target(ti.Tier.proto())
	if !named {
		return ti
	}
	if ti.Injected != (Injected{}) { // undo the daemon's injection
		ti.ReadLatency, ti.WriteLatency = ti.MeasuredReadLatency, ti.MeasuredWriteLatency
		ti.MeasuredReadLatency, ti.MeasuredWriteLatency = Latency{}, Latency{}
	}
	ti.Injected = Injected{Latency: tg.Latency, Bandwidth: tg.Bandwidth}
	if tg.Zero() {
		ti.Injected = Injected{}
		return ti
	}
	ti.MeasuredReadLatency, ti.MeasuredWriteLatency = ti.ReadLatency, ti.WriteLatency
	ns := tg.Duration(64).Nanoseconds()
	ti.ReadLatency = Latency{P50Ns: ns, P99Ns: ns, Source: "injected"}
	ti.WriteLatency = ti.ReadLatency
	return ti
}

// emulated is latency emulation as a decorator: it times each call of the
// backend it wraps from its start and waits out the rest of the target
// for the bytes moved. Bytes (direct loads and stores) passes through
// unslowed; retire is the wrapped backend's.
type emulated struct {
	in   emulation.Injector
	next backend
}

var _ backend = (*emulated)(nil)

// withEmulation is be with the emulation of target, or be itself for none.
func withEmulation(be backend, target emulation.Target) backend {
	if target.Zero() {
		return be
	}
	return &emulated{in: emulation.NewInjector(target), next: be}
}

// Each call defers the wait with its start time taken as the defer runs,
// before the wrapped call.

func (e *emulated) readAt(p []byte, off int64) (int, error) {
	defer e.in.Wait(time.Now(), len(p))
	return e.next.readAt(p, off)
}

func (e *emulated) writeAt(p []byte, off int64) (int, error) {
	defer e.in.Wait(time.Now(), len(p))
	return e.next.writeAt(p, off)
}

func (e *emulated) load64(off int64) (uint64, error) {
	defer e.in.Wait(time.Now(), 8)
	return e.next.load64(off)
}

func (e *emulated) store64(off int64, v uint64) error {
	defer e.in.Wait(time.Now(), 8)
	return e.next.store64(off, v)
}

func (e *emulated) compareAndSwap64(off int64, old, new uint64) (bool, error) {
	defer e.in.Wait(time.Now(), 8)
	return e.next.compareAndSwap64(off, old, new)
}

func (e *emulated) add64(off int64, delta uint64) (uint64, error) {
	defer e.in.Wait(time.Now(), 8)
	return e.next.add64(off, delta)
}

func (e *emulated) bytes() []byte { return e.next.bytes() }

func (e *emulated) retire(ctx context.Context) error { return e.next.retire(ctx) }
