package emulation

import (
	"slices"
	"sync"
	"time"
)

// Injector applies one tier's target to calls. The zero value injects
// nothing. A plain value, safe for concurrent use.
type Injector struct {
	target Target
	// early is how much sooner than the target the wait ends, so that the
	// code outside the timed span (the first clock read, the return) is
	// paid from the target rather than on top of it.
	early time.Duration
}

// NewInjector returns an injector for target, calibrated against this
// process's clock at the target's latency (once per latency: up to a few
// milliseconds the first time).
func NewInjector(target Target) Injector {
	if target.Zero() {
		return Injector{}
	}
	return Injector{target: target, early: earlyFor(target.Latency)}
}

// Calibration is per target latency because the overshoot depends on it
// (a spin that runs once exits differently from one that runs a hundred
// times); beyond maxCalibrated it no longer matters against the target.
const (
	minCalibrated = 100 * time.Nanosecond
	maxCalibrated = 10 * time.Microsecond
)

var (
	earlyMu sync.Mutex
	earlyAt = map[time.Duration]time.Duration{}
)

func earlyFor(lat time.Duration) time.Duration {
	lat = min(max(lat, minCalibrated), maxCalibrated)
	earlyMu.Lock()
	defer earlyMu.Unlock()
	e, ok := earlyAt[lat]
	if !ok {
		e = overshoot(lat)
		earlyAt[lat] = e
	}
	return e
}

// Target is what the injector adds.
func (in Injector) Target() Target { return in.target }

// Wait returns once the target for a call moving n bytes has passed since
// start, which the caller took (time.Now) just before the untreated
// operation. It spins for the last stretch and sleeps before that when
// the wait is long.
func (in Injector) Wait(start time.Time, n int) {
	wait(start, in.target.Duration(n)-in.early)
}

// spinLimit is the longest wait done by spinning alone; beyond it Wait
// sleeps until sleepMargin before the end and spins the rest, since a
// sleep on Linux wakes up as much as a millisecond late.
const (
	spinLimit   = 3 * time.Millisecond
	sleepMargin = 2 * time.Millisecond
)

func wait(start time.Time, d time.Duration) {
	if left := d - time.Since(start); left > spinLimit {
		time.Sleep(left - sleepMargin)
	}
	for time.Since(start) < d {
	}
}

// Calibration is what Calibrate found about this process's clock.
// A plain value.
type Calibration struct {
	// ClockRead is the median cost of one monotonic clock read.
	ClockRead time.Duration
	// Early is, for a 2 µs target, how much sooner a wait ends so that a
	// call, measured from before it starts to after it returns, takes the
	// target: the overshoot of an uncorrected wait around a 64-byte copy.
	Early time.Duration
}

// Calibrate measures, once per process, the clock read's cost and the
// overshoot of a wait (see Calibration). Later calls return the first
// result.
var Calibrate = sync.OnceValue(calibrate)

// calibrationTarget is the wait Calibrate measures the overshoot of: long
// enough that the spin loop runs, short enough to repeat many times.
const calibrationTarget = 2 * time.Microsecond

var calibrationSink [64]byte

//go:noinline
func untreated(src []byte) { copy(calibrationSink[:], src) }

func calibrate() Calibration {
	const batch, rounds = 64, 301
	var c Calibration
	reads := make([]time.Duration, 0, rounds)
	t0 := time.Now()
	for range rounds {
		s := time.Now()
		for range batch {
			_ = time.Since(t0)
		}
		reads = append(reads, time.Since(s)/batch)
	}
	c.ClockRead = median(reads)
	c.Early = earlyFor(calibrationTarget)
	return c
}

// overshoot is by how much an uncorrected wait of target around a 64-byte
// copy, measured from before to after as a caller would, exceeds target:
// the smallest median of a few runs, since noise (another process on the
// core) only ever adds time.
func overshoot(target time.Duration) time.Duration {
	const rounds = 301
	src := make([]byte, 64)
	best := time.Duration(-1)
	for range 3 {
		over := make([]time.Duration, 0, rounds)
		for range rounds {
			outer := time.Now()
			start := time.Now()
			untreated(src)
			wait(start, target)
			over = append(over, time.Since(outer)-target)
		}
		if m := max(median(over), 0); best < 0 || m < best {
			best = m
		}
	}
	return best
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
