// This file keeps, in the store's volatile file, who maps each segment of a
// device whose descriptor reaches every segment (devdax): the segment's
// extent and its mappers (mappers.go). A restarted daemon reads them back,
// so that the extent of a segment freed while a stopped process still maps
// it stays out of the allocator (holdExtent) across the restart, and a live
// segment's mappers are known by their processes, not only presumed for a
// lease. The entries are of this boot only: the volatile file is dropped
// when the host restarts, and so are the processes.

package pool

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/farmem/farmem/internal/errs"
)

// mappedPrefix starts the volatile file's meta keys of mapped entries, each
// followed by the segment's id as 8 big-endian bytes.
var mappedPrefix = []byte("mapped/")

func mappedKey(id uint64) []byte { return binary.BigEndian.AppendUint64(bytes.Clone(mappedPrefix), id) }

// mappedEntry is a devdax segment's extent and the mappers that may still
// write it, as the store keeps them.
type mappedEntry struct {
	device         string
	offset, extent int64
	by             []mapper // sorted by client, pid and start
}

// mappedVersion is the form encodeMapped writes.
const mappedVersion = 1

// errMappedCorrupt is a mapped entry that does not decode.
var errMappedCorrupt = errs.Sub(errs.ErrInvalid, "corrupt entry of who maps a segment")

func encodeMapped(e mappedEntry) []byte {
	b := []byte{mappedVersion}
	b = appendString(b, e.device)
	b = binary.AppendVarint(b, e.offset)
	b = binary.AppendVarint(b, e.extent)
	b = binary.AppendUvarint(b, uint64(len(e.by)))
	for _, m := range e.by {
		b = appendString(b, m.client)
		b = binary.AppendVarint(b, int64(m.pid))
		b = binary.AppendUvarint(b, m.start)
	}
	return b
}

// decodeMapped reads what encodeMapped wrote; an error matches
// errMappedCorrupt (or errRecordVersion for a newer form).
func decodeMapped(v []byte) (mappedEntry, error) {
	if len(v) == 0 {
		return mappedEntry{}, fmt.Errorf("%w: empty", errMappedCorrupt)
	}
	switch {
	case v[0] == 0:
		return mappedEntry{}, fmt.Errorf("%w: version 0", errMappedCorrupt)
	case v[0] > mappedVersion:
		return mappedEntry{}, fmt.Errorf("%w: mapped entry version %d, and this poold reads version %d; upgrade poold to the release that wrote this --data-dir, or a newer one", errRecordVersion, v[0], mappedVersion)
	}
	d := recordDecoder{b: v[1:]}
	e := mappedEntry{device: d.string(), offset: d.varint(), extent: d.varint()}
	n := d.uvarint()
	if n > uint64(len(d.b))/3 { // each mapper takes three bytes or more
		return mappedEntry{}, fmt.Errorf("%w: %d mappers in %d bytes", errMappedCorrupt, n, len(d.b))
	}
	for range n {
		m := mapper{client: d.string()}
		pid := d.varint()
		m.start = d.uvarint()
		if pid < 0 || pid > 1<<31-1 {
			return mappedEntry{}, fmt.Errorf("%w: pid %d", errMappedCorrupt, pid)
		}
		m.pid = int32(pid)
		e.by = append(e.by, m)
	}
	switch {
	case d.err != nil:
		return mappedEntry{}, fmt.Errorf("%w: %v", errMappedCorrupt, d.err)
	case len(d.b) > 0:
		return mappedEntry{}, fmt.Errorf("%w: %d bytes after the last field", errMappedCorrupt, len(d.b))
	case e.device == "" || e.offset < 0 || e.extent <= 0:
		return mappedEntry{}, fmt.Errorf("%w: extent [%d, +%d) of device %q", errMappedCorrupt, e.offset, e.extent, e.device)
	}
	return e, nil
}

// sortMappers orders ms as mappedEntry.by is.
func sortMappers(ms []mapper) []mapper {
	slices.SortFunc(ms, func(a, b mapper) int {
		return cmp.Or(cmp.Compare(a.client, b.client), cmp.Compare(a.pid, b.pid), cmp.Compare(a.start, b.start))
	})
	return ms
}

// submitMapped queues one commit to the volatile file that writes put's
// entries and removes those of the segments in del, and returns the wait
// for it (storeFile.submit), which the caller must call.
func (s *store) submitMapped(put map[uint64]mappedEntry, del []uint64) (wait func() error) {
	vs := make(map[uint64][]byte, len(put))
	for id, e := range put {
		vs[id] = encodeMapped(e)
	}
	return s.volatile.submit(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		for _, id := range slices.Sorted(maps.Keys(vs)) {
			if err := b.Put(mappedKey(id), vs[id]); err != nil {
				return err
			}
		}
		for _, id := range del {
			if err := b.Delete(mappedKey(id)); err != nil {
				return err
			}
		}
		return nil
	}, len(put) == 0)
}

// mapped returns the entries the volatile file holds, by segment id, and
// the ids of those that do not decode (to be removed: what they held is
// not known). An entry in a newer form fails it, as a newer record fails
// load: this poold cannot tell what the memory it names is held for.
func (s *store) mapped() (out map[uint64]mappedEntry, corrupt []uint64, err error) {
	out = map[uint64]mappedEntry{}
	err = s.volatile.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketMeta).Cursor()
		for k, v := c.Seek(mappedPrefix); k != nil && bytes.HasPrefix(k, mappedPrefix); k, v = c.Next() {
			if len(k) != len(mappedPrefix)+8 {
				continue
			}
			id := binary.BigEndian.Uint64(k[len(mappedPrefix):])
			e, err := decodeMapped(v)
			switch {
			case errors.Is(err, errRecordVersion):
				return fmt.Errorf("segment %d: %w", id, err)
			case err != nil:
				corrupt = append(corrupt, id)
				continue
			}
			out[id] = e
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("metadata store %s: %w", s.volatile.path, err)
	}
	return out, corrupt, nil
}
