package alloc

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/mmap"
)

// mapped is the backend of a load/store segment: its memory mapped into
// this process from the descriptor the daemon passed (local DRAM, CXL,
// emulated CXL). Reads and writes are copies, the atomics are the CPU's
// (guarded against faults on every mapping). Memory that can fault has
// the guarded backend, whose copies are guarded too.
//
// A 64-byte copy costs a few nanoseconds, about what an interface call
// does, so Segment's ReadAt and WriteAt call these two backends' methods
// directly (and inline mapped's) when they are not wrapped in emulation;
// BenchmarkSegmentIO and BenchmarkReadAt64 measure that path.
type mapped struct {
	mem []byte // the mapping; never changes
	// ownPages is set when the mapped pages belong to the segment alone
	// (its own file, unlinked by the daemon when freed): retire then leaves
	// the mapping readable for retireGrace, so a copy that raced Free
	// finishes on pages no one else can get, instead of faulting.
	ownPages bool
	// durability is what Persist does on this mapping (persist.go).
	durability Durability
}

// guarded is mapped memory that can fault (real CXL memory with a poisoned
// line, a file on a disk filesystem): its copies turn a fault into
// ErrSegmentLost. Local DRAM (a memfd sealed against resizing) and an
// emulated device's own file on tmpfs or hugetlbfs (its pages reserved
// when the daemon created it) cannot fault short of the machine's own
// memory failing, as the Go heap could, and are not guarded.
//
// The memory guarded is a device's (CXL devdax, a memory-only NUMA node)
// that can go away while mapped; once the daemon reports the segment lost
// (its device went away, see setLost), every call fails with
// ErrSegmentLost, whether or not the kernel has taken the pages yet.
type guarded struct {
	mapped
	id uint64 // the segment's, for errors
	// gone is what every call answers once the daemon reported the
	// segment lost (its device went away) or reclaimed (the client's
	// lease ran out); nil while it did neither.
	gone atomic.Pointer[error]
}

// check fails once the segment is reported lost or reclaimed.
func (g *guarded) check() error {
	if err := g.gone.Load(); err != nil {
		return *err
	}
	return nil
}

// setLost fails every call with ErrSegmentLost while the daemon reports
// the segment lost (its device went away).
func (g *guarded) setLost(lost bool) {
	var err error
	if lost {
		err = fmt.Errorf("segment %d: its device went away (poold reported it lost): %w", g.id, ErrSegmentLost)
	}
	g.setGone(err)
}

// setGone makes every call answer err from now on (nil: none).
func (g *guarded) setGone(err error) {
	if err == nil {
		g.gone.Store(nil)
		return
	}
	g.gone.Store(&err)
}

var (
	_ backend = (*mapped)(nil)
	_ backend = (*guarded)(nil)
)

// newMapped is the backend of a load/store segment mapped from f. Its
// pages are its own when it has its own memory file (an emulated device's
// file, a DRAM or NUMA memfd); a devdax segment shares the device's.
func newMapped(info *poolv1.Segment, mem []byte, f *os.File, d Durability) backend {
	own := (info.Kind == "emulated" || info.Kind == "dram" || info.Kind == "numa") && mmap.MemoryBacked(f)
	m := mapped{mem: mem, ownPages: own, durability: d}
	if info.Kind == "numa" || info.Kind != "dram" && !own {
		return &guarded{mapped: m, id: info.Id}
	}
	return &m
}

// faultGuard turns a memory fault during a copy into ErrSegmentLost.
// Callers: old := debug.SetPanicOnFault(true); defer faultGuard(old, &err).
func faultGuard(old bool, err *error) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		f, ok := r.(interface{ Addr() uintptr })
		if !ok {
			panic(r)
		}
		*err = fmt.Errorf("memory fault at %#x (the segment was freed, or its backing truncated or poisoned): %w", f.Addr(), ErrSegmentLost)
	}
}

// guardedCopy is copy for memory that can fault.
func guardedCopy(dst, src []byte) (n int, err error) {
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return copy(dst, src), nil
}

func (m *mapped) readAt(p []byte, off int64) (int, error)  { return copy(p, m.mem[off:]), nil }
func (m *mapped) writeAt(p []byte, off int64) (int, error) { return copy(m.mem[off:], p), nil }

func (g *guarded) readAt(p []byte, off int64) (int, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	return guardedCopy(p, g.mem[off:])
}

func (g *guarded) writeAt(p []byte, off int64) (int, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	return guardedCopy(g.mem[off:], p)
}

func (g *guarded) load64(off int64) (uint64, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	return g.mapped.load64(off)
}

func (g *guarded) store64(off int64, v uint64) error {
	if err := g.check(); err != nil {
		return err
	}
	return g.mapped.store64(off, v)
}

func (g *guarded) compareAndSwap64(off int64, old, new uint64) (bool, error) {
	if err := g.check(); err != nil {
		return false, err
	}
	return g.mapped.compareAndSwap64(off, old, new)
}

func (g *guarded) add64(off int64, delta uint64) (uint64, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	return g.mapped.add64(off, delta)
}

// word is the 8-byte word at off. The mapping is page aligned, so an
// 8-aligned offset is an 8-aligned address.
func (m *mapped) word(off int64) *uint64 { return (*uint64)(unsafe.Pointer(&m.mem[off])) }

func (m *mapped) load64(off int64) (v uint64, err error) {
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return atomic.LoadUint64(m.word(off)), nil
}

func (m *mapped) store64(off int64, v uint64) (err error) {
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	atomic.StoreUint64(m.word(off), v)
	return nil
}

func (m *mapped) compareAndSwap64(off int64, old, new uint64) (swapped bool, err error) {
	prev := debug.SetPanicOnFault(true)
	defer faultGuard(prev, &err)
	return atomic.CompareAndSwapUint64(m.word(off), old, new), nil
}

func (m *mapped) add64(off int64, delta uint64) (v uint64, err error) {
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return atomic.AddUint64(m.word(off), delta), nil
}

func (m *mapped) bytes() []byte { return m.mem }

// retire gives the mapping up (see mmap.Retire): a copy that raced it
// finishes on the segment's own pages or faults into an error.
func (m *mapped) retire(context.Context) error {
	mmap.Retire(m.mem, retireGrace, m.ownPages)
	return nil
}
