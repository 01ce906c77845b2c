package bench

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
)

// Memory is the floor: a plain []byte in this process, read and written
// with copy, and atomic.AddUint64 for atomics. Safe for concurrent use.
type Memory struct {
	mem   []byte
	words [Keys]uint64
}

var _ System = (*Memory)(nil)

// NewMemory returns the in-process []byte system.
func NewMemory() *Memory { return &Memory{} }

// Name is "memory".
func (m *Memory) Name() string { return "memory" }

// Prepare allocates Keys values of size bytes.
func (m *Memory) Prepare(_ context.Context, op Op, size int) error {
	if op != Atomic && len(m.mem) < Keys*size {
		m.mem = make([]byte, Keys*size)
	}
	return nil
}

// Do copies to or from key's slot.
func (m *Memory) Do(_ context.Context, op Op, key int, buf []byte) error {
	switch op {
	case Read:
		copy(buf, m.mem[key*len(buf):])
	case Write:
		copy(m.mem[key*len(buf):], buf)
	default:
		atomic.AddUint64(&m.words[key], 1)
	}
	return nil
}

// ServerPID is 0: there is no server.
func (m *Memory) ServerPID() int { return 0 }

// Close drops the memory.
func (m *Memory) Close() error { m.mem = nil; return nil }

// Segment is what the farmem systems need of an *alloc.Segment.
type Segment interface {
	io.ReaderAt
	io.WriterAt
	// Add64 atomically adds delta to the word at off.
	Add64(off int64, delta uint64) (uint64, error)
	// Size is the segment's size in bytes.
	Size() int64
}

// Farmem drives one farmem tier through a segment's ReadAt, WriteAt and
// Add64, exactly as an application would. Safe for concurrent use.
type Farmem struct {
	name string
	seg  Segment
	pid  int
}

var _ System = (*Farmem)(nil)

// NewFarmem returns the system name (farmem-cxl, farmem-dram, farmem-rdma)
// on seg, which must hold at least Keys values of the largest size run.
// serverPID is the local process that serves the segment's data plane or
// owns it (poold), 0 if none is local or it is this process. The caller
// keeps ownership of seg.
func NewFarmem(name string, seg Segment, serverPID int) *Farmem {
	return &Farmem{name: name, seg: seg, pid: serverPID}
}

// Name is the name given to NewFarmem.
func (f *Farmem) Name() string { return f.name }

// Prepare writes the Keys values a case reads.
func (f *Farmem) Prepare(_ context.Context, op Op, size int) error {
	if int64(Keys*size) > f.seg.Size() {
		return fmt.Errorf("%w: %s: a segment of %d B holds no %d values of %d B; allocate %d B", ErrInvalid, f.name, f.seg.Size(), Keys, size, Keys*size)
	}
	if op != Read {
		return nil
	}
	buf := make([]byte, size)
	for k := range Keys {
		buf[0] = byte(k)
		if _, err := f.seg.WriteAt(buf, int64(k*size)); err != nil {
			return err
		}
	}
	return nil
}

// Do reads, writes or adds at key's slot.
func (f *Farmem) Do(_ context.Context, op Op, key int, buf []byte) error {
	var err error
	switch op {
	case Read:
		_, err = f.seg.ReadAt(buf, int64(key*len(buf)))
	case Write:
		_, err = f.seg.WriteAt(buf, int64(key*len(buf)))
	default:
		_, err = f.seg.Add64(int64(key*8), 1)
	}
	return err
}

// ServerPID is the process given to NewFarmem.
func (f *Farmem) ServerPID() int { return f.pid }

// Close does nothing: the caller owns the segment.
func (f *Farmem) Close() error { return nil }
