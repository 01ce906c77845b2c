package emulation

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestInjectorAccuracy checks that a waited call takes its target: the p50
// of a few thousand calls around a 64-byte copy, each measured from before
// the call to after it, divided by the target, lies in [0.8, 1.25]. An
// injector off by 2× (e.g. adding the target to the real cost of a slow
// clock, or not waiting at all) fails. A noisy machine gets one retry.
func TestInjectorAccuracy(t *testing.T) {
	src := make([]byte, 64)
	caller := func(in Injector) func() {
		return func() {
			start := time.Now()
			untreated(src)
			in.Wait(start, len(src))
		}
	}
	// What a call costs with next to nothing injected: a target below that
	// (the race detector slows every clock read) cannot be shown.
	floor := p50(3000, caller(NewInjector(Target{Latency: time.Nanosecond})))
	for _, target := range []time.Duration{200 * time.Nanosecond, time.Microsecond, 2 * time.Microsecond} {
		t.Run(target.String(), func(t *testing.T) {
			if floor >= target {
				t.Skipf("a call with 1 ns injected takes %s here (p50), not below the %s target, so injection cannot show", floor, target)
			}
			call := caller(NewInjector(Target{Latency: target}))
			var ratio float64
			for range 2 {
				ratio = float64(p50(3000, call)) / float64(target)
				if ratio >= 0.8 && ratio <= 1.25 {
					break
				}
			}
			t.Logf("p50/target = %.3f (calibration %+v)", ratio, Calibrate())
			require.GreaterOrEqual(t, ratio, 0.8)
			require.LessOrEqual(t, ratio, 1.25)
		})
	}
}

// TestInjectorBandwidth checks that a capped call of n bytes takes
// latency + n/bandwidth, again as a ratio.
func TestInjectorBandwidth(t *testing.T) {
	tg := Target{Latency: time.Microsecond, Bandwidth: 1e9} // 4 KiB: +4096 ns
	in := NewInjector(tg)
	buf := make([]byte, 4096)
	var ratio float64
	for range 2 {
		ratio = float64(p50(2000, func() {
			start := time.Now()
			untreated(buf)
			in.Wait(start, len(buf))
		})) / float64(tg.Duration(len(buf)))
		if ratio >= 0.8 && ratio <= 1.25 {
			break
		}
	}
	require.GreaterOrEqual(t, ratio, 0.8)
	require.LessOrEqual(t, ratio, 1.25)
}

// TestInjectorZero checks that the zero injector and a wait shorter than
// the work do not wait.
func TestInjectorZero(t *testing.T) {
	var in Injector
	start := time.Now().Add(-time.Hour)
	in.Wait(start, 1<<20) // returns at once; a hang fails the test by timeout
	NewInjector(Target{Latency: time.Millisecond}).Wait(start, 0)
	require.Positive(t, Calibrate().ClockRead)
}

func p50(n int, call func()) time.Duration {
	d := make([]time.Duration, n)
	for i := range d {
		s := time.Now()
		call()
		d[i] = time.Since(s)
	}
	slices.Sort(d)
	return d[n/2]
}
