package device

import (
	"fmt"
	"math"
	"sync"

	"github.com/farmem/farmem/internal/mmap"
)

// MapOptions tunes Map. The zero value maps lazily: pages fault in on first
// touch. It is a plain value, safe to share.
type MapOptions struct {
	// Populate pre-faults every page at map time (MAP_POPULATE), paying the
	// page faults once up front instead of on first access. Default false.
	Populate bool
}

// Mapping is a Backing mapped into this process, shared (MAP_SHARED) and
// read-write, so stores are seen by every other process mapping the same
// segment.
//
// Bytes may be called from any goroutine; the returned slice aliases the
// mapping and is valid only until Close. Close must not run concurrently
// with accesses to that slice: after Close, touching it faults.
type Mapping struct {
	b []byte // the segment: region[delta : delta+Length]

	mu     sync.Mutex
	region []byte // what mmap returned, page aligned; nil once closed
}

// Map maps b shared and read-write. At most one MapOptions may be passed.
// b.Offset need not be page aligned: the mapping then starts at the page
// below it and Bytes is sliced to the segment. b.File may be closed as soon
// as Map returns; the mapping keeps the memory.
func Map(b Backing, opts ...MapOptions) (*Mapping, error) {
	var o MapOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("device: Map takes at most one MapOptions, got %d: %w", len(opts), ErrInvalid)
	}
	switch {
	case b.File == nil:
		return nil, fmt.Errorf("device: map: Backing has no File: %w", ErrInvalid)
	case b.Offset < 0 || b.Length <= 0:
		return nil, fmt.Errorf("device: map %s: offset %d length %d: offset must be >= 0 and length > 0: %w", b.File.Name(), b.Offset, b.Length, ErrInvalid)
	}
	start := b.Offset &^ (pageSize - 1)
	delta := b.Offset - start
	if b.Length > math.MaxInt-delta || b.Length > math.MaxInt64-b.Offset {
		return nil, fmt.Errorf("device: map %s: offset %d length %d overflows the address space: %w", b.File.Name(), b.Offset, b.Length, ErrInvalid)
	}
	region, err := mmapFile(b.File, start, delta+b.Length, o.Populate)
	if err != nil {
		return nil, fmt.Errorf("device: map %s offset %d length %d: %w", b.File.Name(), b.Offset, b.Length, err)
	}
	end := delta + b.Length
	return &Mapping{b: region[delta:end:end], region: region}, nil
}

// Bytes returns the segment's memory. It is valid only until Close.
func (m *Mapping) Bytes() []byte { return m.b }

// Close unmaps the memory. Idempotent.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.region == nil {
		return nil
	}
	err := mmap.Unmap(m.region)
	m.region = nil
	if err != nil {
		return fmt.Errorf("device: unmap: %w", err)
	}
	return nil
}
