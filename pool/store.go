package pool

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
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
	// keyVolatileBoot, in the fsynced file's meta bucket, is the host's
	// boot id when the volatile file was started.
	keyVolatileBoot = []byte("volatile-boot")
)

// store is the metadata store: the segment table, the segment id counter
// and the identities bound to client ids, in two bbolt files in the data
// directory. Every change is committed before the daemon acknowledges it.
//
// The durability of a segment's record matches its memory's. The records
// of segments whose contents survive a power loss — on persistent memory
// (a devdax device of a pmem region or an NVDIMM namespace), or homed on a
// peer, another host — are in the embedded storeFile, segments.db,
// fsynced at each commit unless Config.MetadataFsync was turned off; so
// are the id counter and the identities (the storeFile's own db and update
// serve them). The records
// of segments in volatile memory (DRAM, emulated CXL on tmpfs or
// hugetlbfs, a NUMA node, a ram region's devdax device, the rdma export
// device) are in the volatile
// file, segments-volatile.db, with which processes map each devdax segment
// (mappedstore.go), committed without an fsync: a commit reaches
// the page cache, which outlives a kill of the daemon but not a crash of
// the host, and neither do those segments' contents. A third choice, an
// unsynced bucket in segments.db, would put the fsynced records at risk:
// bbolt reuses the pages an older, synced transaction still points to, so
// an unsynced commit that a power loss cuts short can leave that
// transaction's tree torn.
//
// The volatile file is trusted only on the boot of the host that wrote it:
// segments.db keeps the boot id it was started on, and a poold that finds
// another boot id removes the file before opening it, so that a file a
// crash may have left half-written is never read (its segments are gone
// with their memory). A record is in one file for its whole life
// (record.Volatile says which): a segment's durability is its device's,
// which does not change. Where the host's boot id cannot be read, the
// volatile file is fsynced as segments.db is.
//
// It is safe for concurrent use.
type store struct {
	*storeFile
	volatile *storeFile
	// dropped: the volatile file of an earlier boot of the host was
	// removed at open.
	dropped bool
}

// storeFile is one bbolt file of the store. Every change is committed
// before the caller returns, and fsynced too unless it was opened with
// noSync. It is safe for concurrent use.
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
// old one: a removal may need a few new pages. The file has a reserve file
// of reserveSize bytes beside it for them: a removal that fails for space
// deletes it and commits again. The reserve is made again once the
// filesystem has room; until then other changes commit only while bbolt
// has free pages of its own (left by removals) or the filesystem has half
// the reserve's room, so that they do not eat the room the next removal
// needs, and health reports the store degraded.
type storeFile struct {
	db      *bolt.DB
	path    string // the bbolt file
	reserve string // the reserve file
	// commits counts the transactions committed; each was fsynced unless
	// db.NoSync.
	commits atomic.Uint64

	mu      sync.Mutex
	queue   []*change
	running bool // a caller is committing the queue
	// fault is why the last commit failed for space; nil once one succeeds.
	fault error
	// reserveOut: the reserve file is missing (used by a removal, or the
	// filesystem was full when it was to be made).
	reserveOut bool
	// inject, set by tests only, is asked about each change before it
	// commits (removal: the change only deletes); an error fails that
	// change, as a disk that refuses the write would. nil in poold.
	inject func(removal bool) error
}

// change is one queued update and where its outcome goes.
type change struct {
	fn      func(*bolt.Tx) error
	removal bool // only deletes: may use the reserve
	done    chan error
	lead    chan struct{} // receives when this caller is to commit the queue
}

const (
	// reserveSize is each reserve file's size: room for the pages of some
	// sixty commits on a full filesystem, while bbolt recycles the pages
	// earlier removals freed.
	reserveSize = 256 << 10
	// storeFileName is the fsynced file in the data directory.
	storeFileName = "segments.db"
	// volatileFileName is the volatile file in the data directory.
	volatileFileName = "segments-volatile.db"
	// reserveSuffix names a file's reserve file after it.
	reserveSuffix = ".reserve"
	// roomPages is how many free pages bbolt must hold, while the reserve
	// is out, before a change other than a removal may commit (see
	// roomWithoutReserve): a put rewrites a leaf and its branches (and may
	// split them) on free pages instead of new ones at the end of the file.
	roomPages = 16
)

// storeFiles are the files of the store in a data directory, each followed
// by its reserve file.
func storeFiles(dir string) []string {
	var out []string
	for _, name := range []string{storeFileName, volatileFileName} {
		out = append(out, filepath.Join(dir, name), filepath.Join(dir, name+reserveSuffix))
	}
	return out
}

// errMetadataFull is the metadata store's filesystem out of space.
var errMetadataFull = errs.Sub(errs.ErrNoCapacity, "no space for the metadata store")

// openStore opens the store in dir, fsyncing segments.db if fsync
// (Config.MetadataFsync).
func openStore(dir string, fsync bool) (*store, error) {
	return openStoreBoot(dir, fsync, bootID())
}

// openStoreBoot is openStore on the host boot boot ("" for unknown).
func openStoreBoot(dir string, fsync bool, boot string) (_ *store, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w (choose another with --data-dir)", dir, err)
	}
	durable, err := openStoreFile(filepath.Join(dir, storeFileName), !fsync)
	if err != nil {
		return nil, err
	}
	s := &store{storeFile: durable}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	volatileSync := fsync && boot == ""
	if boot != "" {
		if s.dropped, err = s.startBoot(boot); err != nil {
			return nil, fmt.Errorf("metadata store %s: record the host's boot id: %w", durable.path, err)
		}
	}
	if s.volatile, err = openStoreFile(filepath.Join(dir, volatileFileName), !volatileSync); err != nil {
		return nil, err
	}
	return s, nil
}

// startBoot removes the volatile file if it was started on another boot of
// the host (or its start was not recorded), then records this boot in
// segments.db; dropped reports a removed file.
func (s *store) startBoot(boot string) (dropped bool, err error) {
	var was string
	if err := s.db.View(func(tx *bolt.Tx) error {
		was = string(tx.Bucket(bucketMeta).Get(keyVolatileBoot))
		return nil
	}); err != nil {
		return false, err
	}
	if was == boot {
		return false, nil
	}
	path := filepath.Join(filepath.Dir(s.path), volatileFileName)
	for _, p := range []string{path, path + reserveSuffix} {
		switch err := os.Remove(p); {
		case err == nil:
			dropped = dropped || p == path
		case !errors.Is(err, fs.ErrNotExist):
			return false, fmt.Errorf("remove %s, written before the host restarted: %w", p, err)
		}
	}
	return dropped, s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyVolatileBoot, []byte(boot))
	}, false)
}

// openStoreFile opens (or makes) one file of the store, with its buckets
// and its reserve file.
func openStoreFile(path string, noSync bool) (*storeFile, error) {
	dir := filepath.Dir(path)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: noSync, NoFreelistSync: true})
	if err != nil {
		if device.IsNoSpace(err) {
			return nil, fmt.Errorf("metadata store %s: %w", path, fullError(dir, err))
		}
		return nil, fmt.Errorf("metadata store %s: %w (is another poold using this --data-dir?)", path, err)
	}
	f := &storeFile{db: db, path: path, reserve: path + reserveSuffix}
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
	f.reserveOut = f.makeReserve() != nil
	return f, nil
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
func (f *storeFile) makeReserve() error {
	file, err := os.OpenFile(f.reserve, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(file.Fd()), 0, 0, reserveSize)
	if errors.Is(err, unix.EOPNOTSUPP) {
		_, err = file.WriteAt(make([]byte, reserveSize), 0)
	}
	if err == nil {
		err = file.Sync()
	}
	err = errors.Join(err, file.Close())
	if err != nil {
		os.Remove(f.reserve)
	}
	return err
}

// health is nil when the file commits and holds its reserve, else why not.
// It makes the reserve again when the filesystem has room by now.
func (f *storeFile) health() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refillLocked()
	switch {
	case f.fault != nil:
		return fmt.Errorf("metadata store %s cannot commit: %w", f.path, f.fault)
	case f.reserveOut:
		return fmt.Errorf("metadata store %s: its reserve for frees (%s) is missing: %w; allocations commit only while it has free pages of its own",
			f.path, size.Size(reserveSize).Human(), fullError(filepath.Dir(f.path), errors.New("no room for "+f.reserve)))
	}
	return nil
}

// refillLocked makes the reserve again if it is out and room is back.
func (f *storeFile) refillLocked() {
	if !f.reserveOut {
		return
	}
	// A statfs first: while the filesystem is full, writing the file
	// (and removing what it got) on every commit would be wasted work.
	if sp, ok, err := statSpace(filepath.Dir(f.path)); err == nil && ok && sp.avail < reserveSize {
		return
	}
	if f.makeReserve() == nil {
		f.reserveOut = false
	}
}

// update commits fn, grouped with concurrent updates (see storeFile). fn
// must only touch its own keys: it may run in one transaction with
// others', and again on its own when another in its group fails. A removal
// (fn only deletes) may use the reserve (see storeFile).
func (f *storeFile) update(fn func(*bolt.Tx) error, removal bool) error {
	return f.submit(fn, removal)()
}

// submit queues fn as update does and returns the wait for its commit,
// which the caller must call (the first caller of a group commits it from
// its wait). Changes commit in the order they were submitted: a caller
// that submits under a lock and waits after releasing it has its change
// committed before any a later holder of the lock submits, and shares the
// commit with those submitted meanwhile.
func (f *storeFile) submit(fn func(*bolt.Tx) error, removal bool) (wait func() error) {
	c := &change{fn: fn, removal: removal, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	f.mu.Lock()
	f.queue = append(f.queue, c)
	if !f.running {
		f.running = true
		c.lead <- struct{}{}
	}
	f.mu.Unlock()
	return func() error { return f.await(c) }
}

// await waits for c's commit, committing the queue when c leads it.
func (f *storeFile) await(c *change) error {
	for {
		select {
		case err := <-c.done:
			return err
		case <-c.lead:
			// c is queued, so the group holds it: one commit and c is done.
			f.mu.Lock()
			group := f.queue
			f.queue = nil
			f.mu.Unlock()
			f.commit(group)
			// Hand the next group to one of its own callers rather than
			// commit it here: no caller waits for more than two commits.
			f.mu.Lock()
			if len(f.queue) > 0 {
				f.queue[0].lead <- struct{}{}
			} else {
				f.running = false
			}
			f.mu.Unlock()
		}
	}
}

// commit runs a group in one transaction; when that fails, or the reserve
// is out, it runs each change in a transaction of its own, so that one bad
// change fails alone and removals can use the reserve.
func (f *storeFile) commit(group []*change) {
	f.mu.Lock()
	degraded := f.reserveOut
	if f.inject != nil {
		group = slices.DeleteFunc(group, func(c *change) bool {
			err := f.inject(c.removal)
			if err != nil {
				c.done <- err
			}
			return err != nil
		})
	}
	f.mu.Unlock()
	if len(group) > 1 && !degraded {
		err := f.tx(func(tx *bolt.Tx) error {
			for _, c := range group {
				if err := c.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			f.committed(nil)
			for _, c := range group {
				c.done <- nil
			}
			return
		}
	}
	for _, c := range group {
		c.done <- f.commitOne(c)
	}
}

// commitOne commits one change, using the reserve for a removal that
// fails for space, and holding other changes back while the reserve is out
// and bbolt has no free pages to put them on.
func (f *storeFile) commitOne(c *change) error {
	f.mu.Lock()
	out := f.reserveOut // refilled after commits that succeed, and by health
	f.mu.Unlock()
	if out && !c.removal && !f.roomWithoutReserve() {
		return fmt.Errorf("metadata store %s: %w", f.path, fullError(filepath.Dir(f.path), errors.New("the rest is kept for frees")))
	}
	err := f.tx(c.fn)
	if err != nil && c.removal && f.spaceFailure(err) && f.useReserve() {
		err = f.tx(c.fn)
	}
	return f.committed(err)
}

// tx commits one transaction, counted in commits.
func (f *storeFile) tx(fn func(*bolt.Tx) error) error {
	err := f.db.Update(fn)
	if err == nil {
		f.commits.Add(1)
	}
	return err
}

// roomWithoutReserve reports whether a change other than a removal may
// commit while the reserve is out: bbolt has free pages of its own to put
// it on, or the filesystem still has half the reserve's room (the other
// half stays for removals).
func (f *storeFile) roomWithoutReserve() bool {
	if st := f.db.Stats(); st.FreePageN+st.PendingPageN >= roomPages {
		return true
	}
	sp, ok, err := statSpace(filepath.Dir(f.path))
	return err == nil && (!ok || sp.avail >= reserveSize/2)
}

// useReserve deletes the reserve file so that a removal finds room; false
// when it was out already.
func (f *storeFile) useReserve() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reserveOut {
		return false
	}
	f.reserveOut = true
	return os.Remove(f.reserve) == nil
}

// committed records a commit's outcome for health and returns the error
// for the caller: one that failed for space matches errs.ErrNoCapacity.
func (f *storeFile) committed(err error) error {
	if err != nil && f.spaceFailure(err) {
		err = fmt.Errorf("metadata store %s: %w", f.path, fullError(filepath.Dir(f.path), err))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err == nil:
		f.fault = nil
		f.refillLocked()
	case errors.Is(err, errs.ErrNoCapacity):
		f.fault = err
	}
	return err
}

// spaceFailure reports whether a failed commit failed for want of space:
// the kernel said so, or (bbolt formats some errors without wrapping) the
// filesystem has less room left than the reserve.
func (f *storeFile) spaceFailure(err error) bool {
	if device.IsNoSpace(err) {
		return true
	}
	sp, ok, serr := statSpace(filepath.Dir(f.path))
	return serr == nil && ok && sp.avail < reserveSize
}

func idKey(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// load returns every segment, in the order of their ids, and the next
// unused id. Records in an older form are rewritten in the current one,
// each file's in one transaction, before it returns; migrated is how many.
func (s *store) load() (recs []*record, next uint64, migrated int, err error) {
	next = 1
	err = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyNextID); len(v) == 8 {
			next = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("metadata store %s: %w", s.path, err)
	}
	for _, f := range s.files() {
		rs, n, err := f.load()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("metadata store %s: %w", f.path, err)
		}
		for _, r := range rs {
			r.Volatile = f == s.volatile
			next = max(next, r.ID+1)
		}
		recs = append(recs, rs...)
		migrated += n
	}
	slices.SortFunc(recs, func(a, b *record) int { return cmp.Compare(a.ID, b.ID) })
	for i := 1; i < len(recs); i++ {
		if recs[i].ID == recs[i-1].ID {
			return nil, 0, 0, fmt.Errorf("segment %d: %w: it has a record in both %s and %s; move %s aside to keep the fsynced records only",
				recs[i].ID, errRecordCorrupt, s.path, s.volatile.path, s.volatile.path)
		}
	}
	return recs, next, migrated, nil
}

// files are the store's files, the fsynced one first; volatile is nil
// only while openStoreBoot runs.
func (s *store) files() []*storeFile {
	if s.volatile == nil {
		return []*storeFile{s.storeFile}
	}
	return []*storeFile{s.storeFile, s.volatile}
}

// load returns the file's segments, rewriting those in an older form in
// the current one; migrated is how many. Push notes left by a daemon
// that kept them beyond their record's seal are removed in the same
// transaction.
func (f *storeFile) load() (recs []*record, migrated int, err error) {
	type stale struct {
		key []byte
		r   *record
	}
	var old []stale    // records in an older form
	var notes [][]byte // push notes of records that are not sealed
	err = f.db.View(func(tx *bolt.Tx) error {
		sealed := map[uint64]bool{}
		err := tx.Bucket(bucketSegments).ForEach(func(k, v []byte) error {
			r, legacy, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("segment record %x: %w", k, err)
			}
			recs = append(recs, r)
			sealed[r.ID] = r.Sealed
			if legacy { // k is bbolt's only while the transaction lasts
				old = append(old, stale{slices.Clone(k), r})
			}
			return nil
		})
		if err != nil {
			return err
		}
		c := tx.Bucket(bucketMeta).Cursor()
		for k, _ := c.Seek(pushedPrefix); bytes.HasPrefix(k, pushedPrefix); k, _ = c.Next() {
			if id := k[len(pushedPrefix):]; len(id) != 8 || !sealed[binary.BigEndian.Uint64(id)] {
				notes = append(notes, slices.Clone(k))
			}
		}
		return nil
	})
	if err != nil || len(old)+len(notes) == 0 {
		return recs, 0, err
	}
	err = f.tx(func(tx *bolt.Tx) error {
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
		meta := tx.Bucket(bucketMeta)
		for _, k := range notes {
			if err := meta.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if device.IsNoSpace(err) {
			err = fullError(filepath.Dir(f.path), err)
		}
		return nil, 0, fmt.Errorf("rewrite %d segment records in schema version %d and remove %d stale push notes: %w", len(old), recordVersion, len(notes), err)
	}
	return recs, len(old), nil
}

// reserveIDs makes ids below next durable as used, so that an id is never
// handed out twice across a crash.
func (s *store) reserveIDs(next uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyNextID, idKey(next))
	}, false)
}

// put commits records: those of each file in one transaction, the
// fsynced file's first. A record committed unsealed loses its push note
// (pushedKey) in the same transaction: the note matters only while the
// record is sealed, so the move that left it was undone or is over.
func (s *store) put(rs ...*record) error {
	for f, rs := range s.byFile(rs) {
		vs := make([][]byte, len(rs))
		for i, r := range rs {
			v, err := encodeRecord(r)
			if err != nil {
				return err
			}
			vs[i] = v
		}
		err := f.update(func(tx *bolt.Tx) error {
			b, meta := tx.Bucket(bucketSegments), tx.Bucket(bucketMeta)
			for i, r := range rs {
				if err := b.Put(idKey(r.ID), vs[i]); err != nil {
					return err
				}
				if !r.Sealed {
					if err := meta.Delete(pushedKey(r.ID)); err != nil {
						return err
					}
				}
			}
			return nil
		}, false)
		if err != nil {
			return err
		}
	}
	return nil
}

// delete commits the removal of some records, with their push notes,
// from each file in one transaction.
func (s *store) delete(rs ...*record) error {
	for f, rs := range s.byFile(rs) {
		err := f.update(func(tx *bolt.Tx) error {
			b, meta := tx.Bucket(bucketSegments), tx.Bucket(bucketMeta)
			for _, r := range rs {
				if err := errors.Join(b.Delete(idKey(r.ID)), meta.Delete(pushedKey(r.ID))); err != nil {
					return err
				}
			}
			return nil
		}, true)
		if err != nil {
			return err
		}
	}
	return nil
}

// byFile yields each file that holds some of rs and those records, the
// fsynced file's first.
func (s *store) byFile(rs []*record) iter.Seq2[*storeFile, []*record] {
	return func(yield func(*storeFile, []*record) bool) {
		for _, f := range s.files() {
			var group []*record
			for _, r := range rs {
				if s.fileFor(r) == f {
					group = append(group, r)
				}
			}
			if len(group) > 0 && !yield(f, group) {
				return
			}
		}
	}
}

// batches yields rs in groups of at most n records of one file each, the
// fsynced file's first: each group commits in one transaction (put,
// delete), so that it commits whole or not at all.
func (s *store) batches(rs []*record, n int) iter.Seq[[]*record] {
	return func(yield func([]*record) bool) {
		for _, group := range s.byFile(rs) {
			for batch := range slices.Chunk(group, n) {
				if !yield(batch) {
					return
				}
			}
		}
	}
}

// fileFor is the file that holds r's record (record.Volatile).
func (s *store) fileFor(r *record) *storeFile {
	if r.Volatile {
		return s.volatile
	}
	return s.storeFile
}

// health is nil when both files commit and hold their reserves, else why
// not.
func (s *store) health() error {
	var out []error
	for _, f := range s.files() {
		out = append(out, f.health())
	}
	return errors.Join(out...)
}

// close closes the files, the volatile one first.
func (s *store) close() error {
	files := s.files()
	slices.Reverse(files)
	var out []error
	for _, f := range files {
		out = append(out, f.db.Close())
	}
	return errors.Join(out...)
}
