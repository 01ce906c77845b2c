package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"slices"

	"github.com/hashicorp/memberlist"
)

// Limits of the gossip encoding. Together they keep a realistic Meta (two
// addresses, three tiers) near 100 bytes, far below memberlist.MetaMaxSize;
// a Meta that still encodes to more than that is refused with ErrMetaTooLarge.
const (
	// MaxTiers is the most tiers one node gossips.
	MaxTiers = 8
	// MaxTierName is the longest tier name in bytes.
	MaxTierName = 16
	// MaxAddr is the longest GRPCAddr or DataAddr in bytes.
	MaxAddr = 255
	// MaxZone is the longest zone name in bytes.
	MaxZone = 63
)

// metaVersion is the first byte of the encoding. It changes only when old
// readers could misread new bytes; fields added later are appended after the
// tiers, and version-1 readers ignore trailing bytes.
const metaVersion = 1

// Flag bits of the encoding's second byte. Unknown bits are ignored so that a
// newer node can add flags without breaking older readers.
const (
	flagDraining = 1 << 0
	// flagEvacuating came later: a reader that predates it sees a drain.
	flagEvacuating = 1 << 1
	// flagLane: the node reads overflow lane batches (lane.go), so peers
	// may send it theirs; a node that predates them would drop them.
	flagLane = 1 << 2
)

// TierFree is one tier's capacity as a node gossips it. A value; safe to copy.
type TierFree struct {
	Name     string // tier name: "cxl", "local", "rdma" (1..MaxTierName bytes of [a-z0-9._-])
	Capacity int64  // bytes the node offers on this tier, >= 0
	Free     int64  // bytes not allocated, 0 <= Free <= Capacity
}

// Meta is what each node gossips about itself, carried in memberlist's node
// metadata (at most memberlist.MetaMaxSize bytes, see EncodedSize).
//
// A Meta is a value, but Tiers is a slice: Members, Member, Self and events
// hand out copies whose Tiers the caller owns and may modify.
type Meta struct {
	Proto    uint32 // farmem protocol version the node speaks
	GRPCAddr string // host:port of the node's gRPC control plane (TCP); "" = not serving yet
	DataAddr string // host:port of the node's data plane; "" = not serving yet
	Draining bool   // no new placements on this node (Pick skips it)
	// DrainingSince is when the node began to drain, in Unix milliseconds;
	// 0 when it is not draining (or its writer predates the field).
	DrainingSince int64
	// Evacuating: the draining node moves its segments to other nodes
	// (memctl drain --evacuate); a node sets it only with Draining.
	Evacuating bool
	Tiers      []TierFree // per tier capacity and free bytes, unique names, at most MaxTiers
	// Zone is the node's failure domain (a rack, a power feed, a cloud
	// zone): copies of a redundant segment go to distinct zones while
	// there are enough. "" is no zone given. Names as ValidZone allows.
	Zone string
}

// Tier returns the entry for the named tier.
func (m Meta) Tier(name string) (TierFree, bool) {
	for _, t := range m.Tiers {
		if t.Name == name {
			return t, true
		}
	}
	return TierFree{}, false
}

// Clone returns a copy that shares no memory with m.
func (m Meta) Clone() Meta {
	m.Tiers = slices.Clone(m.Tiers)
	return m
}

// Validate checks the limits of the encoding. It does not check the size
// limit; EncodedSize and the encoder do.
func (m Meta) Validate() error {
	if err := validateAddr("GRPCAddr", m.GRPCAddr); err != nil {
		return err
	}
	if err := validateAddr("DataAddr", m.DataAddr); err != nil {
		return err
	}
	if m.DrainingSince < 0 {
		return fmt.Errorf("%w: draining since %d ms, want >= 0", ErrInvalidMeta, m.DrainingSince)
	}
	if len(m.Tiers) > MaxTiers {
		return fmt.Errorf("%w: %d tiers, at most %d", ErrInvalidMeta, len(m.Tiers), MaxTiers)
	}
	if m.Zone != "" {
		if err := ValidZone(m.Zone); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidMeta, err)
		}
	}
	for i, t := range m.Tiers {
		if err := validateTierName(t.Name); err != nil {
			return fmt.Errorf("%w: tier %d: %w", ErrInvalidMeta, i, err)
		}
		for _, u := range m.Tiers[:i] {
			if u.Name == t.Name {
				return fmt.Errorf("%w: tier %q listed twice", ErrInvalidMeta, t.Name)
			}
		}
		if t.Capacity < 0 || t.Free < 0 || t.Free > t.Capacity {
			return fmt.Errorf("%w: tier %q: capacity %d and free %d must satisfy 0 <= free <= capacity",
				ErrInvalidMeta, t.Name, t.Capacity, t.Free)
		}
	}
	return nil
}

// validateTierName allows a short lower-case identifier, so that a tier name
// received by gossip is safe to print and to use as a metric label.
func validateTierName(name string) error { return validateLabel("name", name, MaxTierName) }

// ValidZone checks a zone name: 1 to MaxZone bytes of [a-z0-9._-], so that
// a zone received by gossip is safe to print and to use as a metric label.
func ValidZone(zone string) error { return validateLabel("zone", zone, MaxZone) }

// validateLabel checks that s, the what of a node, is 1 to max bytes of
// [a-z0-9._-].
func validateLabel(what, s string, max int) error {
	if s == "" || len(s) > max {
		return fmt.Errorf("%s %q must be 1..%d bytes", what, s, max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%s %q: byte %d is not one of [a-z0-9._-]", what, s, i)
		}
	}
	return nil
}

// validateAddr allows "" or a host:port of printable ASCII, so that an
// address received by gossip cannot inject control bytes into logs.
func validateAddr(field, addr string) error {
	if addr == "" {
		return nil
	}
	if len(addr) > MaxAddr {
		return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrInvalidMeta, field, len(addr), MaxAddr)
	}
	for i := 0; i < len(addr); i++ {
		if addr[i] <= ' ' || addr[i] > '~' {
			return fmt.Errorf("%w: %s %q: byte %d is not printable ASCII", ErrInvalidMeta, field, addr, i)
		}
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%w: %s %q is not host:port: %w", ErrInvalidMeta, field, addr, err)
	}
	return nil
}

// EncodedSize returns the number of bytes m takes in gossip, or an error if
// m is invalid or larger than memberlist.MetaMaxSize.
func (m Meta) EncodedSize() (int, error) {
	b, err := encodeMeta(m, stamp{})
	return len(b), err
}

// stamp is what the encoding carries beside a Meta: the node's boot id and
// the sequence number of the newest capacity update (capacity.go) whose free
// bytes the Meta's tiers already hold, so that a receiver can tell whether a
// capacity update it holds is newer than the Meta; and whether the node
// reads overflow lane batches (flagLane).
type stamp struct {
	boot   uint64
	capSeq uint64
	lane   bool
}

// encodeMeta encodes m with its stamp. Layout, version 1:
//
//	+---------+-------+-----------+--------+-------------+-------------+--------+-------------------------------+---------+
//	| version | flags | boot (8B) | proto  | grpc addr   | data addr   | ntiers | ntiers x (name, capacity, free)| cap seq |
//	| 1 byte  | 1 byte| big endian| uvarint| uvarint+len | uvarint+len | uvarint| uvarint+len, uvarint, uvarint | uvarint |
//	+---------+-------+-----------+--------+-------------+-------------+--------+-------------------------------+---------+
//
// Flags: bit 0 draining, bit 1 evacuating, bit 2 reads overflow lane
// batches (the last two added later).
// Appended later, after the tiers: cap seq (uvarint), then draining since
// (uvarint, Unix ms), then zone (uvarint+len). Each is left out when 0 (or
// empty) and nothing follows it, and readers that predate a field ignore it. Bytes after them are reserved for
// fields appended later and ignored.
func encodeMeta(m Meta, st stamp) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 64+len(m.GRPCAddr)+len(m.DataAddr)+len(m.Tiers)*24)
	var flags byte
	if m.Draining {
		flags |= flagDraining
	}
	if m.Evacuating {
		flags |= flagEvacuating
	}
	if st.lane {
		flags |= flagLane
	}
	b = append(b, metaVersion, flags)
	b = binary.BigEndian.AppendUint64(b, st.boot)
	b = binary.AppendUvarint(b, uint64(m.Proto))
	b = appendString(b, m.GRPCAddr)
	b = appendString(b, m.DataAddr)
	b = binary.AppendUvarint(b, uint64(len(m.Tiers)))
	for _, t := range m.Tiers {
		b = appendString(b, t.Name)
		b = binary.AppendUvarint(b, uint64(t.Capacity))
		b = binary.AppendUvarint(b, uint64(t.Free))
	}
	if st.capSeq != 0 || m.DrainingSince != 0 || m.Zone != "" {
		b = binary.AppendUvarint(b, st.capSeq)
	}
	if m.DrainingSince != 0 || m.Zone != "" {
		b = binary.AppendUvarint(b, uint64(m.DrainingSince))
	}
	if m.Zone != "" {
		b = appendString(b, m.Zone)
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes (%d tiers, addresses of %d and %d bytes)",
			ErrMetaTooLarge, len(b), len(m.Tiers), len(m.GRPCAddr), len(m.DataAddr))
	}
	return b, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// metaReader walks an encoded Meta; the first error sticks.
type metaReader struct {
	b   []byte
	err error
}

func (r *metaReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrBadMeta}, args...)...)
	}
}

func (r *metaReader) uvarint(what string, max uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("%s: truncated or overlong varint", what)
		return 0
	}
	r.b = r.b[n:]
	if v > max {
		r.fail("%s is %d, at most %d", what, v, max)
		return 0
	}
	return v
}

func (r *metaReader) str(what string, max int) string {
	n := int(r.uvarint(what+" length", uint64(max)))
	if r.err != nil {
		return ""
	}
	if len(r.b) < n {
		r.fail("%s: %d bytes announced, %d left", what, n, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// decodeMeta parses bytes written by encodeMeta (or by a newer or older
// version-1 writer). It never panics and checks the same limits as Validate,
// so every Meta it returns is valid.
func decodeMeta(b []byte) (Meta, stamp, error) {
	var m Meta
	if len(b) == 0 {
		return m, stamp{}, fmt.Errorf("%w: empty (the node runs no farmem cluster code)", ErrBadMeta)
	}
	if b[0] != metaVersion {
		return m, stamp{}, fmt.Errorf("%w: format version %d, this node reads version %d", ErrBadMeta, b[0], metaVersion)
	}
	if len(b) < 10 {
		return m, stamp{}, fmt.Errorf("%w: %d bytes, the header alone is 10", ErrBadMeta, len(b))
	}
	m.Draining = b[1]&flagDraining != 0
	m.Evacuating = b[1]&flagEvacuating != 0
	st := stamp{boot: binary.BigEndian.Uint64(b[2:10]), lane: b[1]&flagLane != 0}
	r := metaReader{b: b[10:]}
	m.Proto = uint32(r.uvarint("proto", math.MaxUint32))
	m.GRPCAddr = r.str("grpc addr", MaxAddr)
	m.DataAddr = r.str("data addr", MaxAddr)
	n := int(r.uvarint("tier count", MaxTiers))
	if r.err == nil && n > 0 {
		m.Tiers = make([]TierFree, n)
		for i := range m.Tiers {
			t := &m.Tiers[i]
			t.Name = r.str("tier name", MaxTierName)
			t.Capacity = int64(r.uvarint("tier capacity", math.MaxInt64))
			t.Free = int64(r.uvarint("tier free", math.MaxInt64))
		}
	}
	if r.err == nil && len(r.b) > 0 {
		st.capSeq = r.uvarint("capacity sequence", math.MaxUint64)
	}
	if r.err == nil && len(r.b) > 0 {
		m.DrainingSince = int64(r.uvarint("draining since", math.MaxInt64))
	}
	if r.err == nil && len(r.b) > 0 {
		m.Zone = r.str("zone", MaxZone)
	}
	if r.err != nil {
		return Meta{}, stamp{}, r.err
	}
	if err := m.Validate(); err != nil {
		return Meta{}, stamp{}, fmt.Errorf("%w: %w", ErrBadMeta, err)
	}
	return m, st, nil
}
