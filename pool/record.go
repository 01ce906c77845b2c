// This file holds the segment record and its encoding in the metadata
// store: a versioned binary form, and the JSON form of stores written
// before records had a version, which the store rewrites on open.

package pool

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	redspec "github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/internal/tier"
	"github.com/farmem/farmem/rdma"
)

// record is one segment as the segment table holds it.
type record struct {
	ID      uint64
	Name    string
	Tier    poolv1.Tier
	Device  string
	Offset  int64
	Extent  int64 // bytes reserved on the device (Size rounded up to its alignment)
	Size    int64 // bytes the client asked for
	Owner   string
	Persist bool
	Epoch   uint64
	Created time.Time // UTC, without a monotonic reading
	// Attached lists the client ids that attached the segment by name.
	Attached []string
	Lost     bool
	// Key is the rdma access key of an exported segment, zero for others
	// (no exporter issues the zero key).
	Key rdma.Key
	// A segment placed on a peer: its home node, its id there, and the
	// home's data-plane address.
	Home     string
	HomeID   uint64
	DataAddr string
	// Whether the home serves its data plane over TLS, as it said when it
	// placed the segment; nil in records written before homes said so.
	DataTLS *bool
	// Who may attach and free a named segment (grants.go): the creator's
	// identity and the identities it granted. Grants is set on every
	// record written since grants exist; an older named record is
	// migrated once at start (core.migrateGrants).
	Creator   string
	Allow     []string
	AllowFree []string
	Grants    bool
	// On a segment a peer daemon placed here: the clients of that daemon
	// whose delegated credentials may use it (delegate.go).
	Delegates []string
	// placement is why Alloc chose the tier, set on the copy Alloc
	// returns and never stored.
	placement *poolv1.Placement
	// Sealed: a move of this segment away from this home is at its
	// switch-over (MoveOut SEAL): operations answer MOVED (but the
	// mover's reads) until the mover commits or aborts, also after a
	// restart (moveout.go).
	Sealed bool
	// Volatile: the segment's contents cannot survive a power loss, so
	// its record is in the store's unsynced file (see store). Not
	// encoded: the file that holds the record says it.
	Volatile bool
	// A redundant segment (redundancy.go), at its origin: what it was
	// placed with (zero: not redundant), one home per copy or shard
	// (replicas: the primary first; erasure coding: data shards 0..k-1,
	// then parity shards 0..m-1) and, erasure coded, the bytes of one
	// shard in one stripe. Home, HomeID, DataAddr, Key, DataTLS and Epoch
	// mirror Homes[0].
	Redundancy redundancy
	Homes      []homeRef
	ShardChunk int64
	// On a copy or shard of a redundant segment that a peer placed here
	// (replicate.go): the nodes whose daemons write it besides its owner,
	// whether the owner's clients may only read it, and whether its
	// writes are forwarded to other homes (a restarted daemon holds its
	// writes until the origin sets the forwarding again).
	Writers  []string
	ReadOnly bool
	Forwards bool
}

// redundancy is what a redundant segment survives: Replicas full copies,
// or Data data and Parity parity shards; Fallback is whether it was asked
// to take fewer than that rather than fail.
type redundancy struct {
	Replicas, Data, Parity int
	Fallback               bool
}

// homeRef is one copy or shard of a redundant segment: its node, its id
// and key there, the node's data-plane address and whether it serves TLS,
// the epoch it holds, its state, and for one being rebuilt the bytes
// copied so far.
type homeRef struct {
	Node     string
	HomeID   uint64
	DataAddr string
	Key      rdma.Key
	Epoch    uint64
	DataTLS  bool
	State    poolv1.HomeState
	Rebuilt  int64
}

// pinned reports whether the segment outlives its owner's lease.
func (r *record) pinned() bool { return r.Persist || r.Name != "" }

// The record's form in the segments bucket, under its id as 8 big-endian
// bytes: these fields in this order, with no padding and nothing after.
//
//	version     1 byte, recordVersion
//	id          uv
//	flags       uv, the flag bits below
//	tier        1 byte, the poolv1.Tier number
//	name        str
//	device      str
//	owner       str
//	offset      v
//	extent      v
//	size        v
//	epoch       uv
//	created     v seconds since 1970 UTC, then uv nanoseconds (below 1e9)
//	attached    list
//	key         16 bytes, only when flagKey is set
//	home        str
//	home id     uv
//	data addr   str
//	creator     str
//	allow       list
//	allow free  list
//	delegates   list (from version 2)
//	redundancy  uv replicas, uv data shards, uv parity shards (from version 4)
//	homes       uv count, then per home: node str, home id uv, data addr
//	            str, key 16 bytes, epoch uv, state uv, rebuilt v (version 4)
//	shard chunk v (from version 4)
//	writers     list (from version 4)
//
// Version 3 added the flag flagSealed, version 4 the flags flagFallback,
// flagReadOnly, flagHomeTLS and flagForwards; an older record with a flag it did not
// have set is corrupt. flagHomeTLS is the DataTLS of every home (one
// configuration for the cluster, as DataTLS says of the segment's).
//
// uv is an unsigned varint and v a signed (zig-zag) varint, as
// encoding/binary writes them; str is a uv length and that many bytes; list
// is a uv count and that many strs.
//
// Version 0 is the JSON object that stores written before the version
// byte hold (legacyRecord); its first byte is '{'. A change of fields or
// of their form takes the next version number; a poold refuses a record of
// a version it does not know (errRecordVersion), and rewrites version 0
// records in the current form when it opens the store (store.load);
// version 1 to 3 records (without delegates, without the sealed flag,
// without redundancy) are read as they are and written in the current form
// when they next change.
const recordVersion = 4

// The flags field's bits.
const (
	flagPersist = 1 << iota
	flagLost
	flagGrants
	flagKey        // the key follows the attached list
	flagDataTLSSet // DataTLS is not nil ...
	flagDataTLS    // ... and this is its value
	flagSealed     // a move away from this home is at its switch-over
	flagFallback   // redundancy: fewer homes than asked rather than fail
	flagReadOnly   // a copy or shard placed here: its owner's clients only read it
	flagHomeTLS    // every home of a redundant segment serves TLS
	flagForwards   // a copy or shard placed here: its writes are forwarded
	flagsKnown     = flagForwards<<1 - 1
)

// flagsOf is the flags a record of each version may have.
var flagsOf = [...]uint64{1: flagSealed - 1, 2: flagSealed - 1, 3: flagFallback - 1, 4: flagsKnown}

var (
	// errRecordVersion is a segment record written by a newer poold.
	errRecordVersion = errs.Sub(errs.ErrNotSupported, "written by a newer poold")
	// errRecordCorrupt is a segment record that does not decode.
	errRecordCorrupt = errs.Sub(errs.ErrInvalid, "corrupt")
)

// encodeRecord returns the record's current form.
func encodeRecord(r *record) ([]byte, error) {
	if _, ok := poolv1.Tier_name[int32(r.Tier)]; !ok || r.Tier < 0 || r.Tier > 0xff {
		return nil, fmt.Errorf("segment record %d: %w: unknown tier %d", r.ID, errs.ErrInvalid, r.Tier)
	}
	var flags uint64
	set := func(bit uint64, on bool) {
		if on {
			flags |= bit
		}
	}
	set(flagPersist, r.Persist)
	set(flagLost, r.Lost)
	set(flagGrants, r.Grants)
	set(flagKey, !r.Key.IsZero())
	set(flagDataTLSSet, r.DataTLS != nil)
	set(flagDataTLS, r.DataTLS != nil && *r.DataTLS)
	set(flagSealed, r.Sealed)
	set(flagFallback, r.Redundancy.Fallback)
	set(flagReadOnly, r.ReadOnly)
	set(flagForwards, r.Forwards)
	set(flagHomeTLS, len(r.Homes) > 0 && r.Homes[0].DataTLS)
	for _, h := range r.Homes {
		if h.DataTLS != (flags&flagHomeTLS != 0) {
			return nil, fmt.Errorf("segment record %d: %w: its homes differ in serving TLS", r.ID, errs.ErrInvalid)
		}
	}
	b := []byte{recordVersion}
	b = binary.AppendUvarint(b, r.ID)
	b = binary.AppendUvarint(b, flags)
	b = append(b, byte(r.Tier))
	b = appendString(b, r.Name)
	b = appendString(b, r.Device)
	b = appendString(b, r.Owner)
	b = binary.AppendVarint(b, r.Offset)
	b = binary.AppendVarint(b, r.Extent)
	b = binary.AppendVarint(b, r.Size)
	b = binary.AppendUvarint(b, r.Epoch)
	b = binary.AppendVarint(b, r.Created.Unix())
	b = binary.AppendUvarint(b, uint64(r.Created.Nanosecond()))
	b = appendList(b, r.Attached)
	if flags&flagKey != 0 {
		b = append(b, r.Key[:]...)
	}
	b = appendString(b, r.Home)
	b = binary.AppendUvarint(b, r.HomeID)
	b = appendString(b, r.DataAddr)
	b = appendString(b, r.Creator)
	b = appendList(b, r.Allow)
	b = appendList(b, r.AllowFree)
	b = appendList(b, r.Delegates)
	b = binary.AppendUvarint(b, uint64(r.Redundancy.Replicas))
	b = binary.AppendUvarint(b, uint64(r.Redundancy.Data))
	b = binary.AppendUvarint(b, uint64(r.Redundancy.Parity))
	b = binary.AppendUvarint(b, uint64(len(r.Homes)))
	for _, h := range r.Homes {
		b = appendString(b, h.Node)
		b = binary.AppendUvarint(b, h.HomeID)
		b = appendString(b, h.DataAddr)
		b = append(b, h.Key[:]...)
		b = binary.AppendUvarint(b, h.Epoch)
		b = binary.AppendUvarint(b, uint64(h.State))
		b = binary.AppendVarint(b, h.Rebuilt)
	}
	b = binary.AppendVarint(b, r.ShardChunk)
	b = appendList(b, r.Writers)
	return b, nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendList(b []byte, l []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(l)))
	for _, s := range l {
		b = appendString(b, s)
	}
	return b
}

// decodeRecord reads a record in any form this poold knows; legacy reports
// that it was in the JSON form of version 0, to be rewritten. An error
// matches errRecordVersion (a newer poold wrote it) or errRecordCorrupt.
func decodeRecord(v []byte) (r *record, legacy bool, err error) {
	switch {
	case len(v) == 0:
		return nil, false, fmt.Errorf("%w: empty", errRecordCorrupt)
	case v[0] == '{':
		r, err := decodeLegacy(v)
		return r, true, err
	case v[0] < 1 || v[0] > recordVersion:
		return nil, false, fmt.Errorf("%w: schema version %d, and this poold reads versions 0 to %d; upgrade poold to the release that wrote this --data-dir, or a newer one",
			errRecordVersion, v[0], recordVersion)
	}
	d := recordDecoder{b: v[1:]}
	r = &record{ID: d.uvarint()}
	flags := d.uvarint()
	tierNum := d.byte()
	r.Name, r.Device, r.Owner = d.string(), d.string(), d.string()
	r.Offset, r.Extent, r.Size = d.varint(), d.varint(), d.varint()
	r.Epoch = d.uvarint()
	sec, nsec := d.varint(), d.uvarint()
	r.Attached = d.list()
	if flags&flagKey != 0 {
		d.bytes(r.Key[:])
	}
	r.Home, r.HomeID, r.DataAddr = d.string(), d.uvarint(), d.string()
	r.Creator, r.Allow, r.AllowFree = d.string(), d.list(), d.list()
	if v[0] >= 2 {
		r.Delegates = d.list()
	}
	if v[0] >= 4 {
		d.redundancy(r, flags&flagHomeTLS != 0)
	}
	known := flagsOf[v[0]]
	switch {
	case d.err != nil:
		return nil, false, fmt.Errorf("%w: %v", errRecordCorrupt, d.err)
	case len(d.b) > 0:
		return nil, false, fmt.Errorf("%w: %d bytes after the last field", errRecordCorrupt, len(d.b))
	case flags&^known != 0:
		return nil, false, fmt.Errorf("%w: unknown flags %#x in a version %d record", errRecordCorrupt, flags&^known, v[0])
	case flags&flagKey != 0 && r.Key.IsZero():
		return nil, false, fmt.Errorf("%w: the zero rdma key", errRecordCorrupt)
	case nsec >= uint64(time.Second):
		return nil, false, fmt.Errorf("%w: creation time with %d nanoseconds", errRecordCorrupt, nsec)
	}
	if _, ok := poolv1.Tier_name[int32(tierNum)]; !ok {
		return nil, false, fmt.Errorf("%w: unknown tier %d", errRecordCorrupt, tierNum)
	}
	r.Tier = poolv1.Tier(tierNum)
	r.Created = time.Unix(sec, int64(nsec)).UTC()
	r.Persist, r.Lost, r.Grants = flags&flagPersist != 0, flags&flagLost != 0, flags&flagGrants != 0
	r.Sealed = flags&flagSealed != 0
	r.Redundancy.Fallback, r.ReadOnly, r.Forwards = flags&flagFallback != 0, flags&flagReadOnly != 0, flags&flagForwards != 0
	if flags&flagDataTLSSet != 0 {
		tls := flags&flagDataTLS != 0
		r.DataTLS = &tls
	}
	return r, false, nil
}

// redundancy reads a version 4 record's redundancy, homes, shard chunk
// and writers into r; homeTLS is the record's flagHomeTLS.
func (d *recordDecoder) redundancy(r *record, homeTLS bool) {
	r.Redundancy.Replicas, r.Redundancy.Data, r.Redundancy.Parity = d.count(), d.count(), d.count()
	n := d.uvarint()
	// A home takes at least 21 bytes, which bounds the count by what is left.
	if n > uint64(len(d.b))/21 {
		d.fail("the homes")
		return
	}
	for range n {
		h := homeRef{Node: d.string(), HomeID: d.uvarint(), DataAddr: d.string(), DataTLS: homeTLS}
		d.bytes(h.Key[:])
		h.Epoch = d.uvarint()
		st := d.uvarint()
		if _, ok := poolv1.HomeState_name[int32(st)]; !ok || st > 0xff {
			d.fail(fmt.Sprintf("a home's state (%d)", st))
		}
		h.State, h.Rebuilt = poolv1.HomeState(st), d.varint()
		r.Homes = append(r.Homes, h)
	}
	r.ShardChunk = d.varint()
	r.Writers = d.list()
}

// count reads an unsigned varint that counts homes (at most
// redundancy.MaxHomes).
func (d *recordDecoder) count() int {
	n := d.uvarint()
	if n > redspec.MaxHomes {
		d.fail(fmt.Sprintf("a count of homes (%d)", n))
		return 0
	}
	return int(n)
}

// recordDecoder reads a record's fields; after the first error every read
// returns a zero value and err keeps the error.
type recordDecoder struct {
	b   []byte
	err error
}

func (d *recordDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s cut short or malformed", what)
		d.b = nil
	}
}

func (d *recordDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("a varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// varint reads a signed varint: zig-zag over an unsigned one, as
// binary.AppendVarint writes it.
func (d *recordDecoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *recordDecoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("a byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *recordDecoder) bytes(dst []byte) {
	if len(d.b) < len(dst) {
		d.fail(fmt.Sprintf("%d bytes", len(dst)))
		return
	}
	d.b = d.b[copy(dst, d.b):]
}

// string reads a length and that many bytes; the length is checked
// against what is left, so a corrupt one allocates nothing.
func (d *recordDecoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("a string")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// list reads a count and that many strings; nil for none. Each string
// takes at least one byte, which bounds the count by what is left.
func (d *recordDecoder) list() []string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("a list")
		return nil
	}
	if n == 0 {
		return nil
	}
	l := make([]string, 0, n)
	for range n {
		l = append(l, d.string())
	}
	return l
}

// legacyRecord is the JSON form of version 0, with the tier as its name
// and the key as hex digits.
type legacyRecord struct {
	ID        uint64    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Tier      string    `json:"tier"`
	Device    string    `json:"device"`
	Offset    int64     `json:"offset"`
	Extent    int64     `json:"extent"`
	Size      int64     `json:"size"`
	Owner     string    `json:"owner"`
	Persist   bool      `json:"persist,omitempty"`
	Epoch     uint64    `json:"epoch"`
	Created   time.Time `json:"created"`
	Attached  []string  `json:"attached,omitempty"`
	Lost      bool      `json:"lost,omitempty"`
	Key       string    `json:"key,omitempty"`
	Home      string    `json:"home,omitempty"`
	HomeID    uint64    `json:"home_id,omitempty"`
	DataAddr  string    `json:"data_addr,omitempty"`
	DataTLS   *bool     `json:"data_tls,omitempty"`
	Creator   string    `json:"creator,omitempty"`
	Allow     []string  `json:"allow,omitempty"`
	AllowFree []string  `json:"allow_free,omitempty"`
	Grants    bool      `json:"grants,omitempty"`
}

func decodeLegacy(v []byte) (*record, error) {
	var l legacyRecord
	if err := json.Unmarshal(v, &l); err != nil {
		return nil, fmt.Errorf("%w: version 0 (JSON): %v", errRecordCorrupt, err)
	}
	t, err := tier.Parse(l.Tier)
	if err != nil {
		return nil, fmt.Errorf("%w: version 0 (JSON) record %d: %v", errRecordCorrupt, l.ID, err)
	}
	var key rdma.Key // all zeros, as version 0 wrote it, is no key too
	if l.Key != "" {
		if key, err = rdma.ParseKey(l.Key); err != nil {
			return nil, fmt.Errorf("%w: version 0 (JSON) record %d: %v", errRecordCorrupt, l.ID, err)
		}
	}
	return &record{
		ID: l.ID, Name: l.Name, Tier: t, Device: l.Device, Offset: l.Offset, Extent: l.Extent, Size: l.Size,
		Owner: l.Owner, Persist: l.Persist, Epoch: l.Epoch, Created: l.Created.UTC(), Attached: l.Attached, Lost: l.Lost,
		Key: key, Home: l.Home, HomeID: l.HomeID, DataAddr: l.DataAddr, DataTLS: l.DataTLS,
		Creator: l.Creator, Allow: l.Allow, AllowFree: l.AllowFree, Grants: l.Grants,
	}, nil
}
