// This file holds the origin's durable record of a live move under way
// (docs/MOVE.md): the move intent, kept in segments.db's meta bucket from
// the target's allocation until the source has let the segment go, so that
// a restarted origin finishes or undoes what it left.

package pool

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// intentPrefix starts the meta bucket's keys of move intents, each followed
// by the segment's id as 8 big-endian bytes.
var intentPrefix = []byte("move/")

// intent is one move under way, as the origin keeps it.
type intent struct {
	ID       uint64 // the segment's id here
	From     string // the source: the home it leaves
	FromID   uint64 // its id there
	To       string // the target: the home it goes to
	ToID     uint64 // its id there
	Switched bool   // the record names the target; the source is to COMMIT
	// The target's copy as the record is to name it (ToAddr "" when not
	// known: before the target's allocation, an intent of an older
	// poold, a tier move, the move of a redundant segment's home, whose
	// switch-over is committed before it is announced): a restarted
	// origin rolls a sealed move forward with them (core.rollForward).
	ToAddr  string
	ToKey   rdma.Key
	ToEpoch uint64
	ToTLS   bool
	// The leaving home's copy of the move of a redundant segment's home,
	// as the record named it before the switch (FromAddr "" when not
	// known: an intent of an older poold, the move of a whole segment,
	// or a leaving home given up unanswered, after which the writers
	// serve without it): a restarted origin puts it back in the record
	// when the new home is lost and the segment is lost without it
	// (keepLeaving).
	FromAddr  string
	FromKey   rdma.Key
	FromEpoch uint64
	FromTLS   bool
	// undoing: the move failed and the target's copy is being freed (not
	// stored: a restarted daemon undoes it again).
	undoing bool
	// switching: the table names the target of the move of a redundant
	// segment's home in the source's place, and the commit that does is
	// not durable yet (commitHomeSwitch); not stored.
	switching bool
	// copied is the bytes the move of a redundant segment's home copied
	// so far (not stored), for the segment's description.
	copied int64
}

// intentVersion is the form encodeIntent writes:
//
//	version   1 byte, intentVersion
//	id        uv
//	switched  1 byte, 0 or 1
//	from      str
//	from id   uv
//	to        str
//	to id     uv
//	to addr   str                   (version 2 on)
//	to key    16 bytes              (version 2 on)
//	to epoch  uv                    (version 2 on)
//	to tls    1 byte, 0 or 1        (version 2 on)
//	from addr str                   (version 3 on)
//	from key  16 bytes              (version 3 on)
//	from epoch uv                   (version 3 on)
//	from tls  1 byte, 0 or 1        (version 3 on)
//
// with uv and str as in the segment record (record.go). Version 1 intents
// (without the target's copy) and version 2 ones (without the leaving
// home's) still decode.
const intentVersion = 3

// errIntentCorrupt is a move intent that does not decode.
var errIntentCorrupt = errs.Sub(errs.ErrInvalid, "corrupt move intent")

func encodeIntent(in intent) []byte {
	b := []byte{intentVersion}
	b = binary.AppendUvarint(b, in.ID)
	b = append(b, boolByte(in.Switched))
	b = appendString(b, in.From)
	b = binary.AppendUvarint(b, in.FromID)
	b = appendString(b, in.To)
	b = binary.AppendUvarint(b, in.ToID)
	b = appendString(b, in.ToAddr)
	b = append(b, in.ToKey[:]...)
	b = binary.AppendUvarint(b, in.ToEpoch)
	b = append(b, boolByte(in.ToTLS))
	b = appendString(b, in.FromAddr)
	b = append(b, in.FromKey[:]...)
	b = binary.AppendUvarint(b, in.FromEpoch)
	return append(b, boolByte(in.FromTLS))
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// decodeIntent reads what encodeIntent wrote; an error matches
// errIntentCorrupt (or errRecordVersion for a newer form).
func decodeIntent(v []byte) (intent, error) {
	if len(v) == 0 {
		return intent{}, fmt.Errorf("%w: empty", errIntentCorrupt)
	}
	if v[0] == 0 || v[0] > intentVersion {
		return intent{}, fmt.Errorf("%w: move intent version %d, and this poold reads versions 1 to %d; upgrade poold", errRecordVersion, v[0], intentVersion)
	}
	d := recordDecoder{b: v[1:]}
	var in intent
	in.ID = d.uvarint()
	sw := d.byte()
	in.From, in.FromID = d.string(), d.uvarint()
	in.To, in.ToID = d.string(), d.uvarint()
	var tls, fromTLS byte
	if v[0] >= 2 {
		in.ToAddr = d.string()
		d.bytes(in.ToKey[:])
		in.ToEpoch = d.uvarint()
		tls = d.byte()
	}
	if v[0] >= 3 {
		in.FromAddr = d.string()
		d.bytes(in.FromKey[:])
		in.FromEpoch = d.uvarint()
		fromTLS = d.byte()
	}
	switch {
	case d.err != nil:
		return intent{}, fmt.Errorf("%w: %v", errIntentCorrupt, d.err)
	case len(d.b) > 0:
		return intent{}, fmt.Errorf("%w: %d bytes after the last field", errIntentCorrupt, len(d.b))
	case sw > 1 || tls > 1 || fromTLS > 1:
		return intent{}, fmt.Errorf("%w: switched byte %d, tls bytes %d and %d", errIntentCorrupt, sw, tls, fromTLS)
	case in.From == "" || in.To == "":
		return intent{}, fmt.Errorf("%w: no source or target node", errIntentCorrupt)
	}
	in.Switched, in.ToTLS, in.FromTLS = sw == 1, tls == 1, fromTLS == 1
	return in, nil
}

// leaving is the leaving home of the move of a redundant segment's home,
// OK, as the record named it before the switch; false when the intent
// does not hold its copy (FromAddr).
func (in intent) leaving() (homeRef, bool) {
	return homeRef{Node: in.From, HomeID: in.FromID, DataAddr: in.FromAddr, Key: in.FromKey, Epoch: in.FromEpoch, DataTLS: in.FromTLS,
		State: poolv1.HomeState_HOME_STATE_OK}, in.FromAddr != ""
}

// switchedIn reports whether r names the target of move in: its
// switch-over committed. A redundant segment's record names it among its
// homes, lost or not: only the switch puts it there, and only putting the
// leaving home back (keepLeaving, unswitchHome) takes it out.
func (in intent) switchedIn(r *record) bool {
	if !r.redundant() {
		return r.Home == in.To && r.HomeID == in.ToID
	}
	return in.targetAt(r) >= 0
}

// targetOK reports whether r names move in's target OK.
func (in intent) targetOK(r *record) bool {
	j := in.targetAt(r)
	return j >= 0 && r.Homes[j].State == poolv1.HomeState_HOME_STATE_OK
}

// targetAt is the index of move in's target among r's homes, -1 when r
// does not name it.
func (in intent) targetAt(r *record) int {
	return slices.IndexFunc(r.Homes, func(h homeRef) bool { return h.Node == in.To && h.HomeID == in.ToID })
}

// switched is r as it is once move in switched over: homed at the
// target's copy.
func (in intent) switched(r record) record {
	tls := in.ToTLS
	r.Home, r.HomeID, r.Key, r.Epoch, r.DataAddr, r.DataTLS, r.Lost = in.To, in.ToID, in.ToKey, in.ToEpoch, in.ToAddr, &tls, false
	return r
}

func intentKey(id uint64) []byte { return binary.BigEndian.AppendUint64(bytes.Clone(intentPrefix), id) }

// putIntent commits a move intent (in segments.db: the records of segments
// placed on peers are there).
func (s *store) putIntent(in intent) error { return s.submitIntent(in)() }

// submitIntent queues the commit of a move intent as putIntent does and
// returns the wait for it (storeFile.submit), which the caller must call.
func (s *store) submitIntent(in intent) (wait func() error) {
	v := encodeIntent(in)
	return s.submit(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(intentKey(in.ID), v) }, false)
}

// deleteIntent commits the end of a move.
func (s *store) deleteIntent(id uint64) error {
	return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(intentKey(id)) }, true)
}

// switchMove queues the commit of the switch-over of a move, one
// transaction: the record that names the target, and the intent marked
// switched (the source is still to let the segment go). It returns the
// wait for that commit (storeFile.submit), which concurrent switch-overs
// share. The record of a segment demoted from this host's volatile memory
// is in the volatile file: it is committed first, then the intent; a
// restart in between finds the record naming the target, which is what
// switched means (loadMoves).
func (s *store) switchMove(r *record, in intent) (wait func() error) {
	in.Switched = true
	v, err := encodeRecord(r)
	if err != nil {
		return func() error { return err }
	}
	putRecord := func(tx *bolt.Tx) error { return tx.Bucket(bucketSegments).Put(idKey(r.ID), v) }
	if f := s.fileFor(r); f != s.storeFile {
		recorded := f.submit(putRecord, false)
		return func() error {
			if err := recorded(); err != nil {
				return err
			}
			return s.putIntent(in)
		}
	}
	iv := encodeIntent(in)
	return s.submit(func(tx *bolt.Tx) error {
		if err := putRecord(tx); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(intentKey(in.ID), iv)
	}, false)
}

// intents returns the move intents left in the store.
func (s *store) intents() ([]intent, error) {
	var out []intent
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketMeta).Cursor()
		for k, v := c.Seek(intentPrefix); k != nil && bytes.HasPrefix(k, intentPrefix); k, v = c.Next() {
			in, err := decodeIntent(v)
			if err != nil {
				return fmt.Errorf("%s %x: %w", s.path, k, err)
			}
			out = append(out, in)
		}
		return nil
	})
	return out, err
}
