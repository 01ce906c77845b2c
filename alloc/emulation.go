package alloc

import (
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

// emulated is a segment's latency emulation: the injector, and the same
// segment without emulation, whose calls it times. Calls reach plain only
// through the emulated segment, which checks first that it is not freed.
type emulated struct {
	in    emulation.Injector
	plain *Segment
}

// emulate makes call, on the segment without emulation, take the target
// for n bytes: timed from before the call to after the wait.
func emulate[T any](e *emulated, n int, call func(*Segment) (T, error)) (T, error) {
	start := time.Now()
	v, err := call(e.plain)
	e.in.Wait(start, n)
	return v, err
}

// withEmulation gives s the emulation of target: a view of the same memory
// (or remote region) without it, for the timed calls.
func (s *Segment) withEmulation(target emulation.Target) {
	s.slow = s.slow || s.remote != nil
	if target.Zero() {
		return
	}
	plain := &Segment{c: s.c, info: s.info, mem: s.mem, remote: s.remote, guard: s.guard, slow: s.remote != nil}
	s.emu, s.slow = &emulated{in: emulation.NewInjector(target), plain: plain}, true
}
