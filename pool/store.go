package pool

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// record is one segment as the metadata store keeps it.
type record struct {
	ID       uint64    `json:"id"`
	Name     string    `json:"name,omitempty"`
	Tier     string    `json:"tier"`
	Device   string    `json:"device"`
	Offset   int64     `json:"offset"`
	Extent   int64     `json:"extent"` // bytes reserved on the device (Size rounded up to its alignment)
	Size     int64     `json:"size"`   // bytes the client asked for
	Owner    string    `json:"owner"`
	Persist  bool      `json:"persist,omitempty"`
	Epoch    uint64    `json:"epoch"`
	Created  time.Time `json:"created"`
	Attached []string  `json:"attached,omitempty"`
	Lost     bool      `json:"lost,omitempty"`
	Key      string    `json:"key,omitempty"` // rdma access key (hex) of an exported segment
	// A segment placed on a peer: its home node, its id there, and the
	// home's data-plane address.
	Home     string `json:"home,omitempty"`
	HomeID   uint64 `json:"home_id,omitempty"`
	DataAddr string `json:"data_addr,omitempty"`
	// Who may attach and free a named segment (grants.go): the creator's
	// identity and the identities it granted. Grants is set on every
	// record written since grants exist; an older named record is
	// migrated once at start (Pool.migrateGrants).
	Creator   string   `json:"creator,omitempty"`
	Allow     []string `json:"allow,omitempty"`
	AllowFree []string `json:"allow_free,omitempty"`
	Grants    bool     `json:"grants,omitempty"`
}

// pinned reports whether the segment outlives its owner's lease.
func (r *record) pinned() bool { return r.Persist || r.Name != "" }

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
type store struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*change
	running bool // a caller is committing the queue
}

// change is one queued update and where its outcome goes.
type change struct {
	fn   func(*bolt.Tx) error
	done chan error
	lead chan struct{} // receives when this caller is to commit the queue
}

func openStore(dir string, fsync bool) (*store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w (choose another with --data-dir)", dir, err)
	}
	path := filepath.Join(dir, "segments.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoSync: !fsync, NoFreelistSync: true})
	if err != nil {
		return nil, fmt.Errorf("metadata store %s: %w (is another poold using this --data-dir?)", path, err)
	}
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
		return nil, fmt.Errorf("metadata store %s: %w", path, err)
	}
	return &store{db: db}, nil
}

// update commits fn, grouped with concurrent updates (see store). fn must
// only touch its own keys: it may run in one transaction with others', and
// again on its own when another in its group fails.
func (s *store) update(fn func(*bolt.Tx) error) error {
	c := &change{fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
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

// commit runs a group in one transaction; when that fails, it runs each
// change in a transaction of its own, so that one bad change fails alone.
func (s *store) commit(group []*change) {
	if len(group) > 1 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, c := range group {
				if err := c.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			for _, c := range group {
				c.done <- nil
			}
			return
		}
	}
	for _, c := range group {
		c.done <- s.db.Update(c.fn)
	}
}

func idKey(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// load returns every segment and the next unused id.
func (s *store) load() ([]*record, uint64, error) {
	var recs []*record
	next := uint64(1)
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyNextID); len(v) == 8 {
			next = binary.BigEndian.Uint64(v)
		}
		return tx.Bucket(bucketSegments).ForEach(func(k, v []byte) error {
			r := new(record)
			if err := json.Unmarshal(v, r); err != nil {
				return fmt.Errorf("segment record %x: %w", k, err)
			}
			recs = append(recs, r)
			if r.ID >= next {
				next = r.ID + 1
			}
			return nil
		})
	})
	return recs, next, err
}

// reserveIDs makes ids below next durable as used, so that an id is never
// handed out twice across a crash.
func (s *store) reserveIDs(next uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyNextID, idKey(next))
	})
}

// put commits one record.
func (s *store) put(r *record) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSegments).Put(idKey(r.ID), v)
	})
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
	})
}

func (s *store) close() error { return s.db.Close() }
