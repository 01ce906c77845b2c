package tcp

import (
	"crypto/subtle"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/farmem/farmem/rdma"
)

// Export states.
const (
	stateLive    uint32 = 0
	stateLost    uint32 = 1
	stateRevoked uint32 = 2
	// stateSealed: a move's switch-over (Server.Seal): mutating ops answer
	// MOVED; reads go on for the sealing principal only.
	stateSealed uint32 = 3
)

// export is one registered segment. Operations pin it with acquire/release;
// Revoke flips state to revoked and waits on drained until no pin remains,
// so no goroutine touches mem after Revoke returns.
type export struct {
	seg   uint64
	mem   []byte
	key   rdma.Key
	epoch atomic.Uint64
	state atomic.Uint32
	refs  atomic.Int64
	// writers counts the pins of mutating ops (WRITE, CAS, FADD), which
	// Seal waits out.
	writers atomic.Int64
	// reader is the principal whose reads a sealed export still serves.
	reader atomic.Pointer[string]
	// handover is the token (rdma.MoveToken) of the copy a sealed export's
	// last changes reached (Server.Handover), which its MOVED answers
	// carry; 0 until then.
	handover atomic.Uint64
	// dirty records the chunks mutating ops changed while a move copies
	// the segment (Server.Track); nil when nobody tracks.
	dirty atomic.Pointer[dirtyMap]
	// allowed is who may operate on the segment (Server.Allow); nil:
	// every authenticated connection.
	allowed atomic.Pointer[principals]
	// readers may only read the segment (Server.AllowReaders); nil: none.
	readers atomic.Pointer[principals]
	// joined is the join mark of memory that took ops outside this
	// server's reply cache (Server.ExportCopy, ExportKey): the onceClock
	// reading since which every change reaches it here; notJoined while
	// it is filled; 0 for memory that took every op here (Export).
	joined atomic.Uint64

	// fwdMu serialises the mutating ops of a forwarding segment with the
	// handing of their changes to the targets (forward.go), and the XORs
	// on any segment with each other; fwd is the forwarding, nil when
	// none, stored under fwdMu.
	fwdMu sync.Mutex
	fwd   atomic.Pointer[forwarder]
	// stopped is the forwarding StopForward took off whose ops may still
	// be in flight: the next Forward waits for them too. Guarded by fwdMu.
	stopped *forwarder
	// unsettled are the ranges of the ops forwarded and not yet settled
	// (every target answered, or was reported to OnFail): a read that
	// overlaps one waits on settled until it is, so that nothing is read
	// here that a target could still miss (readSettled). Guarded by
	// fwdMu; nUnsettled is its length, for reads to test unlocked.
	unsettled  []fwdRange
	nUnsettled atomic.Int32
	settled    sync.Cond // L is &fwdMu

	drainOnce sync.Once
	drained   chan struct{}
}

// notJoined is the join mark of an export still filled by copy.
const notJoined = ^uint64(0)

func newExport(seg uint64, mem []byte, key rdma.Key, epoch uint64) *export {
	e := &export{seg: seg, mem: mem, key: key, drained: make(chan struct{})}
	e.settled.L = &e.fwdMu
	e.epoch.Store(epoch)
	return e
}

// acquire pins the export for one operation, a mutating one (WRITE, CAS,
// FADD) counted among the writers too. It returns statusOK and the pin, or
// an error status and no pin. The increments come before the state load,
// and Revoke and Seal store the state before loading refs or writers, so
// (sequentially consistent atomics) either this op sees the new state or
// they see the pin.
func (e *export) acquire(mutating bool) uint16 {
	e.refs.Add(1)
	if mutating {
		e.writers.Add(1)
	}
	switch e.state.Load() {
	case stateLive:
		return statusOK
	case stateSealed:
		if !mutating {
			return pinSealedRead // pinned; pin checks the principal
		}
		e.unpin(mutating)
		return statusMoved
	case stateLost:
		e.unpin(mutating)
		return statusSegmentLost
	default:
		e.unpin(mutating)
		return statusAccessDenied
	}
}

// pinSealedRead is acquire's answer to a read of a sealed export: pinned,
// for pin to serve to the mover alone. Never sent on the wire.
const pinSealedRead uint16 = 0xFFFF

// unpin drops the pin acquire took.
func (e *export) unpin(mutating bool) {
	if mutating {
		e.writers.Add(-1)
	}
	e.release()
}

// release drops one pin and wakes Revoke when it was the last.
func (e *export) release() {
	if e.refs.Add(-1) == 0 && e.state.Load() == stateRevoked {
		e.drainOnce.Do(func() { close(e.drained) })
	}
}

// revoke marks the export revoked; wait for drained afterwards.
func (e *export) revoke() {
	e.state.Store(stateRevoked)
	if e.refs.Load() == 0 {
		e.drainOnce.Do(func() { close(e.drained) })
	}
}

// inRange reports whether [off, off+n) lies inside the segment, without
// overflowing.
func (e *export) inRange(off uint64, n uint32) bool {
	size := uint64(len(e.mem))
	return off <= size && uint64(n) <= size-off
}

// word returns the 8-byte word b starts with; the caller checked that b
// holds it and starts 8-byte aligned in the mapping (Export checked that
// mem starts 8-byte aligned, the op that its offset is a multiple of 8).
func word(b []byte) *uint64 {
	return (*uint64)(unsafe.Pointer(&b[0]))
}

// isAligned8 reports whether b starts on an 8-byte boundary.
func isAligned8(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%8 == 0
}

// isFault reports whether a recovered panic value is a memory fault turned
// into a panic by debug.SetPanicOnFault (SIGBUS on a truncated mapping or a
// poisoned line).
func isFault(r any) bool {
	_, ok := r.(interface{ Addr() uintptr })
	return ok
}

// copyGuarded copies src into dst and reports a memory fault instead of
// crashing. The calling goroutine must have SetPanicOnFault(true).
func copyGuarded(dst, src []byte) (n int, fault bool) {
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			fault = true
		}
	}()
	return copy(dst, src), false
}

// errFault is the error of a read or write whose buffer in a mapping
// faulted while crypto/tls copied it (a plain socket's read or write
// fails with EFAULT instead).
var errFault = errors.New("memory fault in a mapped segment")

// readGuarded reads len(dst) bytes from r into dst and reports a memory
// fault in dst instead of crashing: the kernel's EFAULT when r is a
// socket, a recovered fault when crypto/tls copies into dst. A fault
// leaves r's stream at an unknown place: the caller closes it. The calling
// goroutine must have SetPanicOnFault(true).
func readGuarded(r io.Reader, dst []byte) (fault bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			if !isFault(p) {
				panic(p)
			}
			fault, err = true, errFault
		}
	}()
	_, err = io.ReadFull(r, dst)
	return errors.Is(err, syscall.EFAULT), err
}

// xorGuarded XORs src into dst, and reports a memory fault instead of
// crashing. The calling goroutine must have SetPanicOnFault(true).
func xorGuarded(dst, src []byte) (fault bool) {
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			fault = true
		}
	}()
	subtle.XORBytes(dst, dst, src)
	return false
}

// casGuarded is a compare-and-swap that returns the previous value.
func casGuarded(p *uint64, old, new uint64) (prev uint64, swapped, fault bool) {
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			fault = true
		}
	}()
	for {
		cur := atomic.LoadUint64(p)
		if cur != old {
			return cur, false, false
		}
		if atomic.CompareAndSwapUint64(p, old, new) {
			return old, true, false
		}
	}
}

// faddGuarded adds delta and returns the previous value.
func faddGuarded(p *uint64, delta uint64) (prev uint64, fault bool) {
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			fault = true
		}
	}()
	return atomic.AddUint64(p, delta) - delta, false
}

// fwdRange is the range [off, off+n) an op forwarded and not yet settled
// changed.
type fwdRange struct {
	off, n uint64
	fo     *fwdOp
}

// unsettle notes that fo's change of [off, off+n) is on its way to the
// targets. e.fwdMu is held.
func (e *export) unsettle(off, n uint64, fo *fwdOp) {
	e.unsettled = append(e.unsettled, fwdRange{off, n, fo})
	e.nUnsettled.Store(int32(len(e.unsettled)))
}

// settle notes that fo's change reached every target that will have it,
// and wakes the reads that wait for it.
func (e *export) settle(fo *fwdOp) {
	e.fwdMu.Lock()
	if i := slices.IndexFunc(e.unsettled, func(r fwdRange) bool { return r.fo == fo }); i >= 0 {
		e.unsettled = slices.Delete(e.unsettled, i, i+1)
		e.nUnsettled.Store(int32(len(e.unsettled)))
	}
	e.fwdMu.Unlock()
	e.settled.Broadcast()
}

// overlapsUnsettled reports whether [off, off+n) overlaps a range not yet
// settled. e.fwdMu is held.
func (e *export) overlapsUnsettled(off, n uint64) bool {
	for _, r := range e.unsettled {
		if off < r.off+r.n && r.off < off+n {
			return true
		}
	}
	return false
}
