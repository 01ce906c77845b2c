package pool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
)

var (
	bucketSegments = []byte("segments")
	bucketMeta     = []byte("meta")
	keyNextID      = []byte("next-id")
)

// store is the durable segment table: every change is committed before the
// daemon acknowledges it, and fsynced too unless Config.MetadataFsync was
// turned off. It is safe for concurrent use.
//
// Commits are grouped: a caller that finds no commit running runs one with
// every change queued so far, and callers that arrive meanwhile wait and are
// committed together by the next one. A lone change costs one transaction
// and no added delay (bbolt's own Batch waits up to MaxBatchDelay, 10ms by
// default, for company); concurrent changes share one fsync.
//
// A full filesystem: a commit that fails for space returns an error
// matching errs.ErrNoCapacity that names the filesystem. Removals (frees,
// reclaims) must commit even then, since they are how the pool gets room
// back, and bbolt writes a changed page to a new place before it frees the
// old one: a removal may need a few new pages. The store keeps a reserve
// file of reserveSize bytes in the data directory for them: a removal that
// fails for space deletes it and commits again. The reserve is made again
// once the filesystem has room; until then other changes commit only while
// bbolt has free pages of its own (left by removals) or the filesystem has
// half the reserve's room, so that they do not eat the room the next
// removal needs, and health reports the store degraded.
type store struct {
	db      *bolt.DB
	path    string // the bbolt file
	reserve string // the reserve file

	mu      sync.Mutex
	queue   []*change
	running bool // a caller is committing the queue
	// fault is why the last commit failed for space; nil once one succeeds.
	fault error
	// reserveOut: the reserve file is missing (used by a removal, or the
	// filesystem was full when it was to be made).
	reserveOut bool
}

// change is one queued update and where its outcome goes.
type change struct {
	fn      func(*bolt.Tx) error
	removal bool // only deletes: may use the reserve
	done    chan error
	lead    chan struct{} // receives when this caller is to commit the queue
}

const (
	// reserveSize is the reserve file's size: room for the pages of some
	// sixty commits on a full filesystem, while bbolt recycles the pages
	// earlier removals freed.
	reserveSize = 256 << 10
	// storeFileName is the segment table in the data directory.
	storeFileName = "segments.db"
	// reserveFileName is the reserve file in the data directory.
	reserveFileName = storeFileName + ".reserve"
	// roomPages is how many free pages bbolt must hold, while the reserve
	// is out, before a change other than a removal may commit (see
	// roomWithoutReserve): a put rewrites a leaf and its branches (and may
	// split them) on free pages instead of new ones at the end of the file.
	roomPages = 16
)

// errMetadataFull is the metadata store's filesystem out of space.
var errMetadataFull = errs.Sub(errs.ErrNoCapacity, "no space for the metadata store")

func openStore(dir string, fsync bool) (*store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w (choose another with --data-dir)", dir, err)
	}
	path := filepath.Join(dir, storeFileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: !fsync, NoFreelistSync: true})
	if err != nil {
		if device.IsNoSpace(err) {
			return nil, fmt.Errorf("metadata store %s: %w", path, fullError(dir, err))
		}
		return nil, fmt.Errorf("metadata store %s: %w (is another poold using this --data-dir?)", path, err)
	}
	s := &store{db: db, path: path, reserve: filepath.Join(dir, reserveFileName)}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSegments, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		if device.IsNoSpace(err) {
			err = fullError(dir, err)
		}
		return nil, fmt.Errorf("metadata store %s: %w", path, err)
	}
	s.reserveOut = s.makeReserve() != nil
	return s, nil
}

// fullError says that the filesystem holding dir is full, and what to do.
func fullError(dir string, cause error) error {
	where := "the filesystem holding " + dir
	if sp, ok, err := statSpace(dir); err == nil && ok {
		where += " (" + sp.String() + ")"
	}
	return fmt.Errorf("%s is full: %w (%v); free space on it, or move --data-dir to a larger filesystem", where, errMetadataFull, cause)
}

// makeReserve writes the reserve file in full (fallocate, so that its
// blocks are the filesystem's, not a hole), or removes what it wrote.
func (s *store) makeReserve() error {
	f, err := os.OpenFile(s.reserve, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, reserveSize)
	if errors.Is(err, unix.EOPNOTSUPP) {
		_, err = f.WriteAt(make([]byte, reserveSize), 0)
	}
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err != nil {
		os.Remove(s.reserve)
	}
	return err
}

// health is nil when the store commits and holds its reserve, else why not.
// It makes the reserve again when the filesystem has room by now.
func (s *store) health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refillLocked()
	switch {
	case s.fault != nil:
		return fmt.Errorf("metadata store %s cannot commit: %w", s.path, s.fault)
	case s.reserveOut:
		return fmt.Errorf("metadata store %s: its reserve for frees (%s) is missing: %w; allocations commit only while it has free pages of its own",
			s.path, size.Size(reserveSize).Human(), fullError(filepath.Dir(s.path), errors.New("no room for "+s.reserve)))
	}
	return nil
}

// refillLocked makes the reserve again if it is out and room is back.
func (s *store) refillLocked() {
	if !s.reserveOut {
		return
	}
	// A statfs first: while the filesystem is full, writing the file
	// (and removing what it got) on every commit would be wasted work.
	if sp, ok, err := statSpace(filepath.Dir(s.path)); err == nil && ok && sp.avail < reserveSize {
		return
	}
	if s.makeReserve() == nil {
		s.reserveOut = false
	}
}

// update commits fn, grouped with concurrent updates (see store). fn must
// only touch its own keys: it may run in one transaction with others', and
// again on its own when another in its group fails. A removal (fn only
// deletes) may use the reserve (see store).
func (s *store) update(fn func(*bolt.Tx) error, removal bool) error {
	c := &change{fn: fn, removal: removal, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, c)
	if !s.running {
		s.running = true
		c.lead <- struct{}{}
	}
	s.mu.Unlock()
	for {
		select {
		case err := <-c.done:
			return err
		case <-c.lead:
			// c is queued, so the group holds it: one commit and c is done.
			s.mu.Lock()
			group := s.queue
			s.queue = nil
			s.mu.Unlock()
			s.commit(group)
			// Hand the next group to one of its own callers rather than
			// commit it here: no caller waits for more than two commits.
			s.mu.Lock()
			if len(s.queue) > 0 {
				s.queue[0].lead <- struct{}{}
			} else {
				s.running = false
			}
			s.mu.Unlock()
		}
	}
}

// commit runs a group in one transaction; when that fails, or the reserve
// is out, it runs each change in a transaction of its own, so that one bad
// change fails alone and removals can use the reserve.
func (s *store) commit(group []*change) {
	s.mu.Lock()
	degraded := s.reserveOut
	s.mu.Unlock()
	if len(group) > 1 && !degraded {
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, c := range group {
				if err := c.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			s.committed(nil)
			for _, c := range group {
				c.done <- nil
			}
			return
		}
	}
	for _, c := range group {
		c.done <- s.commitOne(c)
	}
}

// commitOne commits one change, using the reserve for a removal that
// fails for space, and holding other changes back while the reserve is out
// and bbolt has no free pages to put them on.
func (s *store) commitOne(c *change) error {
	s.mu.Lock()
	out := s.reserveOut // refilled after commits that succeed, and by health
	s.mu.Unlock()
	if out && !c.removal && !s.roomWithoutReserve() {
		return fmt.Errorf("metadata store %s: %w", s.path, fullError(filepath.Dir(s.path), errors.New("the rest is kept for frees")))
	}
	err := s.db.Update(c.fn)
	if err != nil && c.removal && s.spaceFailure(err) && s.useReserve() {
		err = s.db.Update(c.fn)
	}
	return s.committed(err)
}

// roomWithoutReserve reports whether a change other than a removal may
// commit while the reserve is out: bbolt has free pages of its own to put
// it on, or the filesystem still has half the reserve's room (the other
// half stays for removals).
func (s *store) roomWithoutReserve() bool {
	if st := s.db.Stats(); st.FreePageN+st.PendingPageN >= roomPages {
		return true
	}
	sp, ok, err := statSpace(filepath.Dir(s.path))
	return err == nil && (!ok || sp.avail >= reserveSize/2)
}

// useReserve deletes the reserve file so that a removal finds room; false
// when it was out already.
func (s *store) useReserve() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserveOut {
		return false
	}
	s.reserveOut = true
	return os.Remove(s.reserve) == nil
}

// committed records a commit's outcome for health and returns the error
// for the caller: one that failed for space matches errs.ErrNoCapacity.
func (s *store) committed(err error) error {
	if err != nil && s.spaceFailure(err) {
		err = fmt.Errorf("metadata store %s: %w", s.path, fullError(filepath.Dir(s.path), err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		s.fault = nil
		s.refillLocked()
	case errors.Is(err, errs.ErrNoCapacity):
		s.fault = err
	}
	return err
}

// spaceFailure reports whether a failed commit failed for want of space:
// the kernel said so, or (bbolt formats some errors without wrapping) the
// filesystem has less room left than the reserve.
func (s *store) spaceFailure(err error) bool {
	if device.IsNoSpace(err) {
		return true
	}
	sp, ok, serr := statSpace(filepath.Dir(s.path))
	return serr == nil && ok && sp.avail < reserveSize
}

func idKey(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// load returns every segment and the next unused id. Records in an older
// form are rewritten in the current one, all in one transaction, before it
// returns; migrated is how many.
func (s *store) load() (recs []*record, next uint64, migrated int, err error) {
	next = 1
	type stale struct {
		key []byte
		r   *record
	}
	var old []stale // records in an older form
	err = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyNextID); len(v) == 8 {
			next = binary.BigEndian.Uint64(v)
		}
		return tx.Bucket(bucketSegments).ForEach(func(k, v []byte) error {
			r, legacy, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("segment record %x: %w", k, err)
			}
			recs = append(recs, r)
			if legacy { // k is bbolt's only while the transaction lasts
				old = append(old, stale{slices.Clone(k), r})
			}
			if r.ID >= next {
				next = r.ID + 1
			}
			return nil
		})
	})
	if err != nil || len(old) == 0 {
		return recs, next, 0, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSegments)
		for _, o := range old {
			v, err := encodeRecord(o.r)
			if err != nil {
				return err
			}
			if err := b.Put(o.key, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if device.IsNoSpace(err) {
			err = fullError(filepath.Dir(s.path), err)
		}
		return nil, 0, 0, fmt.Errorf("rewrite %d segment records in schema version %d: %w", len(old), recordVersion, err)
	}
	return recs, next, len(old), nil
}

// reserveIDs makes ids below next durable as used, so that an id is never
// handed out twice across a crash.
func (s *store) reserveIDs(next uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyNextID, idKey(next))
	}, false)
}

// put commits records, in one transaction.
func (s *store) put(rs ...*record) error {
	vs := make([][]byte, len(rs))
	for i, r := range rs {
		v, err := encodeRecord(r)
		if err != nil {
			return err
		}
		vs[i] = v
	}
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSegments)
		for i, r := range rs {
			if err := b.Put(idKey(r.ID), vs[i]); err != nil {
				return err
			}
		}
		return nil
	}, false)
}

// delete commits the removal of some records.
func (s *store) delete(ids ...uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSegments)
		for _, id := range ids {
			if err := b.Delete(idKey(id)); err != nil {
				return err
			}
		}
		return nil
	}, true)
}

func (s *store) close() error { return s.db.Close() }
