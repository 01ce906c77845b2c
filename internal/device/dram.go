package device

import (
	"errors"
	"fmt"
	"os"
	"sync"
)

// DRAM is the local DRAM reference tier: each segment is an anonymous
// memory file (memfd, sealed against resizing so no client can truncate it
// under other mappings) that the device keeps open. Nothing outlives the
// process: after a daemon restart Open returns ErrLost.
//
// A DRAM is safe for concurrent use; calls for the same segment id must not
// overlap.
type DRAM struct {
	capacity int64

	mu     sync.Mutex
	segs   map[uint64]dramSegment
	closed bool
}

// dramSegment is one live memfd and the length it was created with.
type dramSegment struct {
	file   *os.File
	length int64
}

var _ Device = (*DRAM)(nil)

// dramName is the name of the one DRAM device.
const dramName = "dram"

// NewDRAM returns the DRAM device with the given accounting capacity in
// bytes. The capacity reserves nothing; pages are taken on first touch.
func NewDRAM(capacity int64) (*DRAM, error) {
	if err := checkCapacity(dramName, capacity); err != nil {
		return nil, err
	}
	if err := supported("DRAM device"); err != nil {
		return nil, err
	}
	return &DRAM{capacity: capacity, segs: make(map[uint64]dramSegment)}, nil
}

// Name returns "dram".
func (d *DRAM) Name() string { return dramName }

// Kind returns KindDRAM.
func (d *DRAM) Kind() Kind { return KindDRAM }

// Emulated returns false.
func (d *DRAM) Emulated() bool { return false }

// Node returns -1: pages are placed by the kernel's default policy, local
// to whichever CPU first touches them.
func (d *DRAM) Node() int { return -1 }

// Capacity returns the capacity given to NewDRAM, in bytes.
func (d *DRAM) Capacity() int64 { return d.capacity }

// Align returns the page size.
func (d *DRAM) Align() int64 { return pageSize }

// SharesFD returns false: each Backing is the segment's own memfd.
func (d *DRAM) SharesFD() bool { return false }

// Persistent returns false: memfds die with the daemon.
func (d *DRAM) Persistent() bool { return false }

// Create makes a zero-filled memfd for id, replacing (and closing) any
// previous one, and returns a duplicate descriptor of it.
func (d *DRAM) Create(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(dramName, id, off, length, pageSize, d.capacity); err != nil {
		return Backing{}, err
	}
	f, err := createMemfd(fmt.Sprintf("farmem-dram-%016x", id), length)
	if err != nil {
		return Backing{}, fmt.Errorf("device %s: segment %#x: %w", dramName, id, err)
	}
	dup, err := dupFile(f)
	if err != nil {
		_ = f.Close()
		return Backing{}, fmt.Errorf("device %s: segment %#x: %w", dramName, id, err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return Backing{}, errors.Join(d.closedErr(id), f.Close(), dup.Close())
	}
	old, replaced := d.segs[id]
	d.segs[id] = dramSegment{file: f, length: length}
	d.mu.Unlock()
	if replaced {
		_ = old.file.Close() // only our descriptor; clients' mappings keep the old pages
	}
	return Backing{File: dup, Offset: 0, Length: length}, nil
}

// Open returns a duplicate descriptor of the live memfd for id, or ErrLost
// if this device instance has none (the daemon restarted).
func (d *DRAM) Open(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(dramName, id, off, length, pageSize, d.capacity); err != nil {
		return Backing{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Backing{}, d.closedErr(id)
	}
	s, ok := d.segs[id]
	if !ok {
		return Backing{}, fmt.Errorf("device %s: segment %#x: no memfd (DRAM segments do not survive a daemon restart); free the segment: %w",
			dramName, id, ErrLost)
	}
	if s.length != length {
		return Backing{}, fmt.Errorf("device %s: segment %#x: created with length %d, opened with %d: %w", dramName, id, s.length, length, ErrInvalid)
	}
	dup, err := dupFile(s.file)
	if err != nil {
		return Backing{}, fmt.Errorf("device %s: segment %#x: %w", dramName, id, err)
	}
	return Backing{File: dup, Offset: 0, Length: length}, nil
}

// Remove closes the device's memfd for id; the memory is freed once every
// client has closed its descriptor and mapping. A missing id is not an error.
func (d *DRAM) Remove(id uint64, off, length int64) error {
	if err := checkExtent(dramName, id, off, length, pageSize, d.capacity); err != nil {
		return err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return d.closedErr(id)
	}
	s, ok := d.segs[id]
	delete(d.segs, id)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	if err := s.file.Close(); err != nil {
		return fmt.Errorf("device %s: segment %#x: close memfd: %w", dramName, id, err)
	}
	return nil
}

// Close closes every memfd the device holds; their memory is freed once
// clients let go of theirs. Idempotent.
func (d *DRAM) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	segs := d.segs
	d.segs = nil
	d.mu.Unlock()
	var errs []error
	for _, s := range segs {
		errs = append(errs, s.file.Close())
	}
	return errors.Join(errs...)
}

func (d *DRAM) closedErr(id uint64) error {
	return fmt.Errorf("device %s: segment %#x: device is closed: %w", dramName, id, ErrClosed)
}
