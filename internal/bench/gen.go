package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Op is what a case does: read, write or a 64-bit atomic.
type Op string

// The ops.
const (
	// Read fetches size bytes (memcached and Redis: GET).
	Read Op = "read"
	// Write stores size bytes (memcached and Redis: SET).
	Write Op = "write"
	// Atomic is a 64-bit fetch-and-add (memcached incr, Redis INCR); size is 8.
	Atomic Op = "atomic"
)

// Keys is how many distinct keys (or slots of a segment) a case cycles
// through, the same for every system: the working set is Keys × size.
const Keys = 64

// System is something the generator drives. Implementations are safe for
// concurrent use: Do runs on Depth goroutines at once.
type System interface {
	// Name is the system's name in results, e.g. farmem-rdma or memcached.
	Name() string
	// Prepare stores the Keys values (or words, for Atomic) that a case of
	// op and size touches, before the case is timed.
	Prepare(ctx context.Context, op Op, size int) error
	// Do performs one op on key (0 ≤ key < Keys) with buf: len(buf) bytes
	// are read into or written from it. It returns ErrNotSupported (from
	// Prepare or Do) for ops the system lacks.
	Do(ctx context.Context, op Op, key int, buf []byte) error
	// ServerPID is the local process that serves the system, 0 when there
	// is none or it is this process (its CPU time is then in the client's).
	ServerPID() int
	// Close releases what the system holds. Idempotent.
	Close() error
}

// Case is one measurement: op of Size bytes with Depth in flight, for
// Duration (after Warmup) or until Count ops, whichever comes first.
type Case struct {
	Op    Op
	Size  int
	Depth int
	// Duration bounds the timed part. Default 500ms when Count is 0.
	Duration time.Duration
	// Count bounds the number of timed ops; 0 means no bound.
	Count int64
	// Warmup runs before timing, untimed. Default: Duration/10, at least 20ms.
	Warmup time.Duration
}

func (c *Case) check() error {
	switch {
	case c.Op != Read && c.Op != Write && c.Op != Atomic:
		return fmt.Errorf("%w: op %q: use read, write or atomic", ErrInvalid, c.Op)
	case c.Op == Atomic && c.Size != 8:
		return fmt.Errorf("%w: an atomic is 8 bytes, not %d", ErrInvalid, c.Size)
	case c.Size <= 0 || c.Size > 16<<20:
		return fmt.Errorf("%w: size %d: use 1 B to 16 MiB", ErrInvalid, c.Size)
	case c.Depth <= 0 || c.Depth > Keys:
		return fmt.Errorf("%w: depth %d: use 1 to %d in flight", ErrInvalid, c.Depth, Keys)
	case c.Duration < 0 || c.Count < 0 || c.Warmup < 0:
		return fmt.Errorf("%w: negative duration, count or warmup", ErrInvalid)
	}
	if c.Duration == 0 && c.Count == 0 {
		c.Duration = 500 * time.Millisecond
	}
	if c.Warmup == 0 {
		c.Warmup = max(c.Duration/10, 20*time.Millisecond)
	}
	return nil
}

// Result is what Run measured for one case. A plain value.
type Result struct {
	System string
	Case   Case
	// Ops completed in Elapsed.
	Ops     int64
	Elapsed time.Duration
	// Latency of every timed op.
	Latency Histogram
	// ClientCPU is this process's CPU time (user+system, all threads) over
	// the timed part; -1 if unknown.
	ClientCPU time.Duration
	// ServerCPU is the serving process's CPU time over the timed part;
	// -1 if there is no separate local server or it is unknown.
	ServerCPU time.Duration
}

// OpsPerSec is the throughput of the timed part.
func (r *Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Add merges a further measurement of the same case into r (a case run
// in several rounds interleaved with other systems).
func (r *Result) Add(o *Result) {
	r.Ops += o.Ops
	r.Elapsed += o.Elapsed
	r.Latency.Merge(&o.Latency)
	if r.ClientCPU < 0 || o.ClientCPU < 0 {
		r.ClientCPU = -1
	} else {
		r.ClientCPU += o.ClientCPU
	}
	if r.ServerCPU < 0 || o.ServerCPU < 0 {
		r.ServerCPU = -1
	} else {
		r.ServerCPU += o.ServerCPU
	}
}

// Run prepares sys for c and measures it: c.Depth goroutines each issue one
// op at a time (a closed loop) on keys in turn, first for c.Warmup untimed,
// then timed; goroutine i cycles through keys i·K/Depth to
// (i+1)·K/Depth-1 (K = Keys). It stops at the first error an op returns.
func Run(ctx context.Context, sys System, c Case) (*Result, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if err := sys.Prepare(ctx, c.Op, c.Size); err != nil {
		return nil, fmt.Errorf("%s: prepare %s of %d B: %w", sys.Name(), c.Op, c.Size, err)
	}
	if _, err := drive(ctx, sys, c, c.Warmup, 0, false); err != nil {
		return nil, err
	}
	pid := sys.ServerPID()
	res := &Result{System: sys.Name(), Case: c, ClientCPU: -1, ServerCPU: -1}
	cpu0, cerr := SelfCPU()
	var srv0 time.Duration
	serr := ErrUnknown
	if pid > 0 {
		srv0, serr = ProcessCPU(pid)
	}
	st, err := drive(ctx, sys, c, c.Duration, c.Count, true)
	if err != nil {
		return nil, err
	}
	if cpu1, err := SelfCPU(); err == nil && cerr == nil {
		res.ClientCPU = cpu1 - cpu0
	}
	if serr == nil {
		if srv1, err := ProcessCPU(pid); err == nil {
			res.ServerCPU = srv1 - srv0
		}
	}
	res.Ops, res.Elapsed, res.Latency = st.ops, st.elapsed, st.hist
	return res, nil
}

type driven struct {
	ops     int64
	elapsed time.Duration
	hist    Histogram
}

// drive runs the closed loop for d (0: no time bound) or count ops.
func drive(ctx context.Context, sys System, c Case, d time.Duration, count int64, timed bool) (*driven, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		issued atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		out    = &driven{}
	)
	start := time.Now()
	end := start.Add(d)
	for w := range c.Depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := new(Histogram)
			buf := make([]byte, c.Size)
			// Each goroutine cycles through keys of its own, so no two
			// touch the same bytes at once.
			per := Keys / c.Depth
			first := w * per
			var n int64
			for ctx.Err() == nil {
				if count > 0 && issued.Add(1) > count {
					break
				}
				t0 := time.Now()
				if d > 0 && !t0.Before(end) {
					break
				}
				if err := sys.Do(ctx, c.Op, first+int(n%int64(per)), buf); err != nil {
					if ctx.Err() == nil {
						cancel(fmt.Errorf("%s: %s of %d B at depth %d: %w", sys.Name(), c.Op, c.Size, c.Depth, err))
					}
					break
				}
				if timed {
					h.Record(time.Since(t0))
				}
				n++
			}
			mu.Lock()
			out.ops += n
			out.hist.Merge(h)
			mu.Unlock()
		}()
	}
	wg.Wait()
	out.elapsed = time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}
