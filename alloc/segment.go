package alloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/mmap"
)

// Segment is one far-memory allocation. It is safe for concurrent use:
// ReadAt, WriteAt and the atomics may run in parallel with each other (and
// with Free and Close, which make them fail with ErrClosed rather than
// crash).
// Concurrent writes to overlapping bytes race as they would in any memory;
// use the 64-bit atomics to coordinate.
type Segment struct {
	c      *Client
	info   *poolv1.Segment // immutable
	mem    []byte          // the mapping of a load/store segment; never changes
	remote *remote         // how an rdma segment is reached; nil for load/store tiers
	// guard is set when the mapping can fault (real CXL memory with a
	// poisoned line, a file on a disk filesystem): copies then turn faults
	// into errors. Local DRAM (a memfd sealed against resizing) and an
	// emulated device's own file on tmpfs or hugetlbfs (its pages reserved
	// when the daemon created it) cannot fault short of the machine's own
	// memory failing, as the Go heap could, and are not guarded.
	guard bool
	// ownPages is set when the mapped pages belong to the segment alone
	// (its own file, unlinked by the daemon when freed): Free then leaves
	// the mapping readable for retireGrace, so a copy that raced Free
	// finishes on pages no one else can get, instead of faulting.
	ownPages bool
	// slow sends ReadAt, WriteAt and the atomics off the local fast path:
	// set for rdma segments and for segments with latency emulation, so
	// that a local segment without emulation pays no more than before.
	slow bool
	// emu is the latency emulation of the segment's calls; nil for none.
	emu *emulated
	// shared is the coherent attachment of a segment attached with Shared;
	// the byte and atomic calls go to it (slow is set).
	shared *SharedSegment
	closed atomic.Bool
}

// ID is the segment's id on its daemon.
func (s *Segment) ID() uint64 { return s.info.Id }

// Name is the segment's name, "" if it has none.
func (s *Segment) Name() string { return s.info.Name }

// Size is the segment's usable size in bytes.
func (s *Segment) Size() int64 { return s.info.Size }

// Tier is the tier the segment was placed on.
func (s *Segment) Tier() Tier { return tierFromProto(s.info.Tier) }

// Emulated is true when the segment's tier stands in for hardware this host
// lacks (an emulated CXL device is ordinary DRAM).
func (s *Segment) Emulated() bool { return s.info.Emulated }

// Kind says what backs the segment: devdax, numa, emulated, dram.
func (s *Segment) Kind() string { return s.info.Kind }

// Device names the device the segment is on.
func (s *Segment) Device() string { return s.info.Device }

// Node names the host whose memory holds the segment.
func (s *Segment) Node() string { return s.info.Node }

// Injected is the latency emulation applied to the segment's ReadAt,
// WriteAt and atomics (the daemon's --emulate-latency for its tier, or the
// client's WithEmulateLatency); zero for none. It never applies to Bytes.
func (s *Segment) Injected() Injected {
	if s.emu == nil {
		return Injected{}
	}
	return Injected(s.emu.in.Target())
}

// Bytes returns the segment's memory for direct loads and stores on
// load/store tiers (local, cxl), and false on tiers reached over a network.
// The slice is valid only until Free or Client.Close; touching it after
// that faults. A fault in the memory itself (a poisoned CXL line) is
// the caller's to guard (see runtime/debug.SetPanicOnFault). Latency
// emulation cannot slow direct access through this slice.
func (s *Segment) Bytes() ([]byte, bool) {
	if s.mem == nil || s.closed.Load() {
		return nil, false
	}
	return s.mem, true
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

// ReadAt implements io.ReaderAt: it reads len(p) bytes at off, returning
// io.EOF with a short count at the end of the segment. With latency
// emulation on the segment's tier the call takes the injected latency plus
// len(p)/bandwidth (see WithEmulateLatency).
func (s *Segment) ReadAt(p []byte, off int64) (n int, err error) {
	mem := s.mem
	if s.closed.Load() {
		return 0, fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed)
	}
	if s.slow {
		if sh := s.shared; sh != nil {
			return sh.ReadAt(p, off)
		}
		if e := s.emu; e != nil {
			return emulate(e, len(p), func(q *Segment) (int, error) { return q.ReadAt(p, off) })
		}
		return s.remoteReadAt(p, off)
	}
	if off < 0 || off > int64(len(mem)) {
		return 0, fmt.Errorf("read at %d of segment %d (size %d): %w", off, s.info.Id, len(mem), ErrOutOfRange)
	}
	if s.guard {
		return guardedCopy(p, mem[off:])
	}
	n = copy(p, mem[off:])
	if n < len(p) {
		err = io.EOF
	}
	return n, err
}

// guardedCopy is ReadAt's copy for memory that can fault.
func guardedCopy(p, mem []byte) (n int, err error) {
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	n = copy(p, mem)
	if n < len(p) {
		err = io.EOF
	}
	return n, err
}

// WriteAt implements io.WriterAt. A write that would run past the end of
// the segment writes nothing and returns ErrOutOfRange. Latency emulation
// applies as to ReadAt.
func (s *Segment) WriteAt(p []byte, off int64) (n int, err error) {
	mem := s.mem
	if s.closed.Load() {
		return 0, fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed)
	}
	if s.slow {
		if sh := s.shared; sh != nil {
			return sh.WriteAt(p, off)
		}
		if e := s.emu; e != nil {
			return emulate(e, len(p), func(q *Segment) (int, error) { return q.WriteAt(p, off) })
		}
		return s.remoteWriteAt(p, off)
	}
	if off < 0 || off > int64(len(mem)) || int64(len(p)) > int64(len(mem))-off {
		return 0, fmt.Errorf("write of %d bytes at %d of segment %d (size %d): %w", len(p), off, s.info.Id, len(mem), ErrOutOfRange)
	}
	if !s.guard {
		return copy(mem[off:], p), nil
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return copy(mem[off:], p), nil
}

// checkWord checks an atomic's offset.
func (s *Segment) checkWord(off int64) error {
	if s.closed.Load() {
		return fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed)
	}
	if off < 0 || off > s.info.Size-8 {
		return fmt.Errorf("atomic at %d of segment %d (size %d): %w", off, s.info.Id, s.info.Size, ErrOutOfRange)
	}
	if off%8 != 0 {
		return fmt.Errorf("atomic at %d of segment %d: %w", off, s.info.Id, ErrUnaligned)
	}
	return nil
}

// word returns the 8-byte word at off of a mapped segment for an atomic.
func (s *Segment) word(off int64) (*uint64, error) {
	if err := s.checkWord(off); err != nil {
		return nil, err
	}
	// The mapping is page aligned, so an 8-aligned offset is an 8-aligned address.
	return (*uint64)(unsafe.Pointer(&s.mem[off])), nil
}

// Load64 atomically loads the 8-byte word at off (a multiple of 8). Latency
// emulation applies to the atomics as to ReadAt, with a size of 8 bytes.
func (s *Segment) Load64(off int64) (v uint64, err error) {
	if s.slow {
		if sh := s.shared; sh != nil {
			return sh.Load64(off)
		}
		if e := s.emu; e != nil {
			return emulate(e, 8, func(q *Segment) (uint64, error) { return q.Load64(off) })
		}
		if err := s.checkWord(off); err != nil {
			return 0, err
		}
		return s.remoteFetchAdd(off, 0)
	}
	w, err := s.word(off)
	if err != nil {
		return 0, err
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return atomic.LoadUint64(w), nil
}

// Store64 atomically stores v at off (a multiple of 8).
func (s *Segment) Store64(off int64, v uint64) (err error) {
	if s.slow {
		if sh := s.shared; sh != nil {
			return sh.Store64(off, v)
		}
		if e := s.emu; e != nil {
			_, err := emulate(e, 8, func(q *Segment) (struct{}, error) { return struct{}{}, q.Store64(off, v) })
			return err
		}
		if err := s.checkWord(off); err != nil {
			return err
		}
		cur, err := s.remoteFetchAdd(off, 0)
		for err == nil {
			var swapped bool
			if cur, swapped, err = s.remoteCAS(off, cur, v); swapped {
				return nil
			}
		}
		return err
	}
	w, err := s.word(off)
	if err != nil {
		return err
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	atomic.StoreUint64(w, v)
	return nil
}

// CompareAndSwap64 atomically replaces the word at off with new if it
// holds old, reporting whether it did.
func (s *Segment) CompareAndSwap64(off int64, old, new uint64) (swapped bool, err error) {
	if s.slow {
		if sh := s.shared; sh != nil {
			return sh.CompareAndSwap64(off, old, new)
		}
		if e := s.emu; e != nil {
			return emulate(e, 8, func(q *Segment) (bool, error) { return q.CompareAndSwap64(off, old, new) })
		}
		if err := s.checkWord(off); err != nil {
			return false, err
		}
		_, swapped, err = s.remoteCAS(off, old, new)
		return swapped, err
	}
	w, err := s.word(off)
	if err != nil {
		return false, err
	}
	prev := debug.SetPanicOnFault(true)
	defer faultGuard(prev, &err)
	return atomic.CompareAndSwapUint64(w, old, new), nil
}

// Add64 atomically adds delta to the word at off and returns the new value.
func (s *Segment) Add64(off int64, delta uint64) (v uint64, err error) {
	if s.slow {
		if sh := s.shared; sh != nil {
			return sh.Add64(off, delta)
		}
		if e := s.emu; e != nil {
			return emulate(e, 8, func(q *Segment) (uint64, error) { return q.Add64(off, delta) })
		}
		if err := s.checkWord(off); err != nil {
			return 0, err
		}
		prev, err := s.remoteFetchAdd(off, delta)
		return prev + delta, err
	}
	w, err := s.word(off)
	if err != nil {
		return 0, err
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return atomic.AddUint64(w, delta), nil
}

// newMapped is a load/store segment mapped from f.
// Its pages are its own when it has its own memory file (an emulated
// device's file, a DRAM or NUMA memfd); a devdax segment shares the
// device's.
func newMapped(c *Client, info *poolv1.Segment, mem []byte, f *os.File) *Segment {
	own := (info.Kind == "emulated" || info.Kind == "dram" || info.Kind == "numa") && mmap.MemoryBacked(f)
	guard := info.Kind == "numa" || info.Kind != "dram" && !own
	return &Segment{c: c, info: info, mem: mem, ownPages: own, guard: guard}
}

// Free unmaps the segment and releases it on the daemon, for everyone:
// the memory returns to the pool and the name (if any) is gone. That holds
// for a segment this client attached (Attach) as for one it allocated,
// when it may free it (see Client.Attach; else ErrAccessDenied), so an
// attacher that means only to stop using a segment calls Close instead.
// Calls on the segment then return ErrClosed; a slice from Bytes must not
// be used. Freeing twice, or after Close, returns ErrClosed. A shared
// attachment is detached first (its modified pages written back), then the
// segment freed for every sharer.
func (s *Segment) Free(ctx context.Context) error {
	ok, derr := s.retire(ctx)
	if !ok {
		return fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed)
	}
	return errors.Join(derr, s.c.free(ctx, s))
}

// Close lets go of the segment without freeing it: it unmaps the segment
// in this process and, for a segment this client attached by name, gives
// the attachment up on the daemon, so that this client can no longer map
// or free it; the segment and its bytes stay for its owner and other
// attachers. On a segment this client allocated, Close unmaps it and
// leaves it to its lifetime: a named or persistent segment stays until
// freed, an unnamed one until the client's session ends (reopen it with
// Client.Open meanwhile). A shared attachment is detached first, its
// modified pages written back.
//
// Afterwards every call on the segment returns ErrClosed, also one that
// runs concurrently with Close (it never faults), and a slice from Bytes
// must not be used. Close is idempotent: a second Close, or Close after
// Free, returns nil. It waits up to the client's WithTimeout for the daemon.
func (s *Segment) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.timeout)
	defer cancel()
	ok, derr := s.retire(ctx)
	if !ok {
		return nil
	}
	return errors.Join(derr, s.c.detach(ctx, s))
}

// retire marks the segment closed and unmaps it without freeing it; ok is
// false when it was closed already. What a shared attachment cannot hand
// back within ctx is lost, as on a crash, and reported in err.
func (s *Segment) retire(ctx context.Context) (ok bool, err error) {
	if !s.closed.CompareAndSwap(false, true) {
		return false, nil
	}
	mmap.Retire(s.mem, retireGrace, s.ownPages)
	if s.remote != nil {
		s.remote.cancel(fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed))
	}
	if s.shared != nil {
		err = s.shared.Detach(ctx)
	}
	return true, err
}

// retireGrace is how long a retired mapping's address range stays
// reserved (inaccessible) before it is unmapped, so that a call that
// passed the closed check just before Free faults into an error instead of
// reading memory that a later mapping placed at the same address.
const retireGrace = time.Second
