package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/alloc"
)

// The roles of TestSharedSegmentThreeHosts: "shared-create" allocates the
// segment, "sharer" (one per host) attaches it with alloc.Shared and runs
// workers doing reads, writes and compare-and-swaps on a few hot words,
// printing every operation as a line the test turns into a history.
const (
	// segEnv names the shared segment.
	segEnv = "FARMEM_TEST_SEGMENT"
	// sharerEnv is the sharer process's index; its workers are the history's
	// clients sharerWorkers*index + worker.
	sharerEnv = "FARMEM_TEST_SHARER"
	// stopEnv is a file whose appearance ends a sharer's work.
	stopEnv = "FARMEM_TEST_STOP"
)

const (
	// hotPageSize is the shared segments' page size: the hot words sit on
	// three pages, two of them on the first.
	hotPageSize = 512
	// sharerWorkers is how many goroutines of each sharer run operations.
	sharerWorkers = 2
	// syncEvery is how often a sharer calls Sync: a lost write can only be
	// one that returned after the call of the last Sync but one that
	// returned nil, so this bounds how many of a dead sharer's operations
	// become of unknown outcome.
	syncEvery = 20 * time.Millisecond
)

// hotKeys are the offsets of the words the sharers work on; key i of the
// history is the word at hotKeys[i].
var hotKeys = []int64{0, 8, hotPageSize, 2 * hotPageSize}

// The operations a sharer prints, one per line, with times from
// CLOCK_MONOTONIC (the same clock in every process of the machine):
//
//	C <client> <seq> <kind> <key> <value> <old> <new> <call>   before each operation
//	R <client> <seq> <return> <value> <swapped>                 it returned
//	F <client> <seq> <return> <error>                           it failed: outcome unknown
//	G <call>                                                    a Sync called then returned nil
//	FORGET <from> <to>                                          writes that returned in [from, to) may be lost
//	LOST <time>, ATTACHED <time>                                ErrSegmentLost, then attached again
func init() {
	clientRoles["shared-create"] = roleSharedCreate
	clientRoles["sharer"] = roleSharer
}

// monoNow reads CLOCK_MONOTONIC in nanoseconds.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// roleSharedCreate allocates the named rdma segment of three hot pages and
// prints "ready <home>".
func roleSharedCreate(ctx context.Context) error {
	c, err := dialTarget(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	seg, err := c.Alloc(ctx, 3*hotPageSize, alloc.WithName(os.Getenv(segEnv), alloc.AllowIdentity(appIdentity)), alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		return err
	}
	fmt.Println("ready", seg.Node())
	return nil
}

// sharerRun is one sharer process's bookkeeping of what may be lost.
type sharerRun struct {
	index int
	seqs  [sharerWorkers]int

	mu sync.Mutex
	// good are the calls of the last two Syncs that returned nil (or the
	// attachment's start): writes that returned before good[0] are safe.
	good [2]int64
}

// attached restarts the bookkeeping for a new attachment at t.
func (r *sharerRun) attached(t int64) {
	r.mu.Lock()
	r.good = [2]int64{t, t}
	r.mu.Unlock()
}

// synced records a Sync called at call that returned nil.
func (r *sharerRun) synced(call int64) {
	r.mu.Lock()
	r.good = [2]int64{r.good[1], call}
	r.mu.Unlock()
	fmt.Println("G", call)
}

// lost says that writes which returned before to may be lost.
func (r *sharerRun) lost(to int64) {
	r.mu.Lock()
	from := r.good[0]
	r.mu.Unlock()
	fmt.Println("FORGET", from, to)
}

// roleSharer attaches the shared segment, prints "attached <home>", waits
// for the gate, and runs workers until the stop file appears. When the
// segment is lost (its home's poold restarted) it attaches again.
func roleSharer(ctx context.Context) error {
	index, err := strconv.Atoi(os.Getenv(sharerEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", sharerEnv, err)
	}
	name := os.Getenv(segEnv)
	c, err := dialTarget(ctx, alloc.WithOpTimeout(3*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	attach := func() (*alloc.Segment, error) {
		return c.Attach(ctx, name, alloc.Shared(alloc.SharedPageSize(hotPageSize)))
	}
	seg, err := attach()
	if err != nil {
		return err
	}
	fmt.Println("attached", seg.Node())
	if err := waitFile(os.Getenv(gateEnv), time.Minute); err != nil {
		return err
	}
	stop := make(chan struct{})
	go func() {
		waitFile(os.Getenv(stopEnv), 10*time.Minute)
		close(stop)
	}()
	r := &sharerRun{index: index}
	r.attached(monoNow())
	for r.epoch(seg, stop) {
		// The home restarted: every worker has stopped using the old
		// attachment, so nothing it returned after now.
		now := monoNow()
		r.lost(now)
		fmt.Println("LOST", now)
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		seg.Shared().Detach(dctx) // ErrSegmentLost: what it held is gone
		cancel()
		deadline := time.Now().Add(time.Minute)
		for seg, err = attach(); err != nil; seg, err = attach() {
			if time.Now().After(deadline) {
				return fmt.Errorf("attach again after the segment was lost: %w", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		now = monoNow()
		r.attached(now)
		fmt.Println("ATTACHED", now)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	call := monoNow()
	if err := seg.Shared().Sync(sctx); err != nil {
		r.lost(monoNow())
		fmt.Println("final sync:", err)
	} else {
		r.synced(call)
	}
	if err := seg.Shared().Detach(sctx); err != nil {
		fmt.Println("detach:", err)
	}
	fmt.Println("done")
	return nil
}

// epoch runs the workers and the syncer on seg until stop, or until the
// segment is lost, which it reports.
func (r *sharerRun) epoch(seg *alloc.Segment, stop <-chan struct{}) (lost bool) {
	done := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(done) }) }
	var lostSeg atomic.Bool
	onErr := func(err error, at int64) {
		switch {
		case errors.Is(err, alloc.ErrSegmentLost):
			lostSeg.Store(true)
			end()
		case errors.Is(err, alloc.ErrLeaseExpired):
			r.lost(at)
		}
	}
	var wg sync.WaitGroup
	for w := range sharerWorkers {
		wg.Go(func() { r.work(seg, w, done, onErr) })
	}
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(syncEvery):
			}
			call := monoNow()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := seg.Shared().Sync(ctx)
			cancel()
			if err == nil {
				r.synced(call)
			} else {
				onErr(err, monoNow())
			}
		}
	})
	select {
	case <-stop:
	case <-done:
	}
	end()
	wg.Wait()
	return lostSeg.Load()
}

// work runs random operations on the hot words until done.
func (r *sharerRun) work(seg *alloc.Segment, w int, done <-chan struct{}, onErr func(error, int64)) {
	client := sharerWorkers*r.index + w
	rng := rand.New(rand.NewPCG(uint64(client), uint64(time.Now().UnixNano())))
	seen := make([]uint64, len(hotKeys)) // the last value this worker saw per key
	for {
		select {
		case <-done:
			return
		default:
		}
		r.seqs[w]++
		seq := r.seqs[w]
		key := rng.IntN(len(hotKeys))
		off := hotKeys[key]
		kind := [...]int{0, 0, 1, 2}[rng.IntN(4)] // lincheck.Read, Write, CAS: half reads
		val := uint64(client+1)<<32 | uint64(seq)
		old := seen[key]
		call := monoNow()
		fmt.Printf("C %d %d %d %d %d %d %d %d\n", client, seq, kind, key, val, old, val, call)
		var v uint64
		var swapped bool
		var err error
		switch kind {
		case 0:
			v, err = seg.Load64(off)
		case 1:
			err = seg.Store64(off, val)
			v = val
		default:
			swapped, err = seg.CompareAndSwap64(off, old, val)
			if swapped {
				v = val
			}
		}
		ret := monoNow()
		if err != nil {
			fmt.Printf("F %d %d %d %q\n", client, seq, ret, err.Error())
			onErr(err, ret)
		} else {
			fmt.Printf("R %d %d %d %d %t\n", client, seq, ret, v, swapped)
			if kind != 2 || swapped {
				seen[key] = v
			}
		}
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
	}
}

// waitFile waits until the file at path exists.
func waitFile(path string, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("file %s did not appear within %v", path, limit)
		}
	}
}
