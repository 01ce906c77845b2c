package verbs

import (
	"runtime"
	"sync"
	"time"
)

// A connection's pollers yield the processor when yieldEvery has passed
// since the last yield, looking at the clock every yieldPolls polling
// crossings into C (each at most pollSpinNs).
const (
	yieldPolls = 64
	yieldEvery = 4 * time.Millisecond
)

// Test seams: the scheduler yield and the monotonic clock.
var (
	gosched = runtime.Gosched
	clock   = func() time.Duration { return time.Since(clockBase) }
)

var clockBase = time.Now()

// pollYield counts a connection's polling crossings into C and yields the
// processor every few milliseconds while they go on.
//
// A caller that polls its own completions never blocks, so it never passes
// through the Go scheduler. After 10 ms of that, sysmon takes its P away
// in the middle of a C call (as it would preempt a goroutine that runs too
// long), hands the P to another thread and then wakes every 20 µs for a
// while; polling continuously, that repeats every 10 ms, which costs
// about a fifth of a CPU, moves the polling goroutine between threads and
// doubles the 99th percentile of a 64 B READ. A yield every few
// milliseconds keeps sysmon asleep. A yield may itself move the
// goroutine to another thread (it wakes an idle one, which can take the
// goroutine first), so it is rationed by time, not by count; the clock
// is read once per yieldPolls crossings, so where a clock read is a
// system call (a VM on the HPET) it stays rare.
//
// A pollYield is guarded by the poll mutex passed to unlock; it is not
// otherwise safe for concurrent use.
type pollYield struct {
	n    uint32
	last time.Duration // clock() at the last yield
}

// unlock releases mu, held for one or more polling crossings, and yields
// the processor when it is time.
func (y *pollYield) unlock(mu *sync.Mutex) {
	y.n++
	yield := false
	if y.n%yieldPolls == 0 {
		if now := clock(); now-y.last >= yieldEvery {
			y.last, yield = now, true
		}
	}
	mu.Unlock()
	if yield {
		gosched()
	}
}
