package coherence

import (
	"encoding/binary"
	"fmt"
	"time"
)

// SharerID names one attachment of a shared segment: one process's view of
// it, a participant in the directory. It is chosen at random by the sharer
// and never 0, and names one Cache only: a new Cache under an id an earlier
// one used could find that one's request, of the same Seq, still held at
// the home, and count the grant's lease from before its own request.
type SharerID uint64

// Kind says what a Message is. The values are on the wire: append only,
// never renumber or reuse.
type Kind uint8

// The message kinds. "→home" messages are requests a sharer sends (each gets
// exactly one reply); "home→" messages are replies or pushes the home sends.
const (
	// ReadReq (→home) asks for a shared copy of Page and a read lease.
	ReadReq Kind = 1
	// WriteReq (→home) asks for exclusive ownership of Page (also an upgrade
	// from shared).
	WriteReq Kind = 2
	// Grant (home→, reply or push) answers the request numbered Seq: Data is
	// the page, Gen the grant's generation, Lease its duration counted from
	// when the sharer first sent the request (the home's lease plus how long
	// the home held the request), Exclusive whether it is ownership.
	Grant Kind = 3
	// Wait (home→, reply) says the request numbered Seq is queued behind
	// invalidations; its Grant will be pushed.
	Wait Kind = 4
	// Invalidate (home→, push) asks the sharer to drop its copy of Page of
	// generation Gen or older (to shared only, when Downgrade), writing
	// modified data back in its InvAck, and to answer with InvAck(InvID).
	Invalidate Kind = 5
	// InvAck (→home) acknowledges Invalidate InvID; with HasData it carries
	// the modified page (a write-back).
	InvAck Kind = 6
	// WriteBack (→home) stores a modified page of generation Gen at the home.
	// Mode says what the sharer keeps: ownership (renewing its lease), a
	// shared copy, or nothing (eviction, release).
	WriteBack Kind = 7
	// Release (→home) says the sharer dropped its shared copy of Page.
	Release Kind = 8
	// OK (home→, reply) acknowledges an InvAck, WriteBack or Release. For a
	// WriteBack that kept ownership, a non-zero Lease is the renewed lease.
	OK Kind = 9
	// Stale (home→, reply) refuses a WriteBack from a sharer that no longer
	// owns the page (its lease ran out and the page moved on): its data is
	// lost.
	Stale Kind = 10
	// Busy (home→, reply) says the page has another request in progress:
	// retry after Lease (a hint).
	Busy Kind = 11
	// Poll (→home, wire only) asks for the messages pushed to the sharer,
	// waiting up to Lease for one to arrive.
	Poll Kind = 12
	// Refused (home→, reply) rejects a malformed request; Code says why.
	Refused Kind = 13
)

var kindNames = [...]string{
	ReadReq: "ReadReq", WriteReq: "WriteReq", Grant: "Grant", Wait: "Wait",
	Invalidate: "Invalidate", InvAck: "InvAck", WriteBack: "WriteBack",
	Release: "Release", OK: "OK", Stale: "Stale", Busy: "Busy", Poll: "Poll",
	Refused: "Refused",
}

// String returns the kind's name.
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Mode is what a sharer keeps after a WriteBack.
type Mode uint8

// The write-back modes (on the wire; append only).
const (
	// KeepModified keeps ownership and renews its lease (Sync, the keeper).
	KeepModified Mode = 0
	// KeepShared downgrades to a shared copy.
	KeepShared Mode = 1
	// KeepNothing drops the page (eviction, detach).
	KeepNothing Mode = 2
)

// Refusal codes carried by Refused (on the wire; append only).
const (
	// CodeBadPage: Page is past the end of the segment.
	CodeBadPage uint8 = 1
	// CodePageSize: the sharer's page size differs from the directory's.
	CodePageSize uint8 = 2
	// CodeBadKind: the home does not know the message kind.
	CodeBadKind uint8 = 3
	// CodeClosed: the home's directory was closed (segment freed, daemon
	// stopping).
	CodeClosed uint8 = 4
)

// Message is one protocol message, a plain value. Fields a kind does not use
// are zero. Data is owned by whoever holds the Message: the state machines
// copy page data in and out, never retain a Message's Data.
type Message struct {
	Kind Kind
	// From is the sending sharer (requests) or the addressee (pushes).
	From SharerID
	// Incarnation identifies the directory instance: a home that restarted
	// has a new one, and sharers holding the old one lost their pages.
	Incarnation uint64
	// PageSize is the sharer's page size on requests (the home checks it).
	PageSize uint32
	// Page is the page number (offset / PageSize).
	Page uint32
	// Seq numbers a sharer's ReadReq/WriteReq; Grant and Wait echo it. A
	// resent request keeps its Seq.
	Seq uint64
	// Gen is a grant's generation: unique per page and increasing.
	Gen uint64
	// InvID names one Invalidate; InvAck echoes it.
	InvID uint64
	// WBSeq orders a sharer's WriteBacks so a duplicate older one is ignored.
	WBSeq uint64
	// Lease is a grant's or renewal's lease, or Busy's retry hint, or Poll's wait.
	Lease time.Duration
	// Exclusive marks a Grant of ownership.
	Exclusive bool
	// Downgrade marks an Invalidate that leaves a shared copy.
	Downgrade bool
	// HasData says Data carries a page (InvAck).
	HasData bool
	// Mode is a WriteBack's mode.
	Mode Mode
	// Code is a Refused reason.
	Code uint8
	// Data is a page: Grant, InvAck with HasData, WriteBack.
	Data []byte
}

// String formats the message without its data, for logs and test failures.
func (m Message) String() string {
	return fmt.Sprintf("%s{from=%d page=%d seq=%d gen=%d inv=%d wb=%d lease=%s excl=%t down=%t data=%d mode=%d code=%d}",
		m.Kind, m.From, m.Page, m.Seq, m.Gen, m.InvID, m.WBSeq, m.Lease, m.Exclusive, m.Downgrade, len(m.Data), m.Mode, m.Code)
}

// Wire format of one message, little-endian, fixed 72-byte header then data:
//
//	+------+-------+------+------+----------+----------+
//	| kind | flags | mode | code | pagesize | data len |   0..12
//	|  u8  |  u8   |  u8  |  u8  |   u32    |   u32    |
//	+------+-------+------+------+----------+----------+
//	| from u64 | incarnation u64 | page u32 | 0 u32    |  12..36
//	| seq u64  | gen u64 | invid u64 | wbseq u64       |  36..68
//	| lease (u32 microseconds)                         |  68..72
//	+--------------------------------------------------+
//	| data (data len bytes)                            |
//
// flags: bit 0 Exclusive, bit 1 Downgrade, bit 2 HasData. A batch is a u32
// count followed by that many messages.
const headerSize = 72

// MaxData bounds a message's data (1 MiB): the largest page size.
const MaxData = 1 << 20

// MaxBatch bounds the messages in one batch.
const MaxBatch = 4096

var le = binary.LittleEndian

// AppendMessage appends m's encoding to b.
func AppendMessage(b []byte, m *Message) []byte {
	var h [headerSize]byte
	h[0] = byte(m.Kind)
	var fl byte
	if m.Exclusive {
		fl |= 1
	}
	if m.Downgrade {
		fl |= 2
	}
	if m.HasData {
		fl |= 4
	}
	h[1] = fl
	h[2] = byte(m.Mode)
	h[3] = m.Code
	le.PutUint32(h[4:], m.PageSize)
	le.PutUint32(h[8:], uint32(len(m.Data)))
	le.PutUint64(h[12:], uint64(m.From))
	le.PutUint64(h[20:], m.Incarnation)
	le.PutUint32(h[28:], m.Page)
	le.PutUint64(h[36:], m.Seq)
	le.PutUint64(h[44:], m.Gen)
	le.PutUint64(h[52:], m.InvID)
	le.PutUint64(h[60:], m.WBSeq)
	le.PutUint32(h[68:], uint32(min(max(m.Lease.Microseconds(), 0), 1<<32-1)))
	b = append(b, h[:]...)
	return append(b, m.Data...)
}

// DecodeMessage decodes one message from the front of b and returns the
// rest. m.Data aliases b.
func DecodeMessage(b []byte, m *Message) ([]byte, error) {
	if len(b) < headerSize {
		return nil, fmt.Errorf("coherence: message of %d bytes is shorter than its %d-byte header: %w", len(b), headerSize, ErrProtocol)
	}
	fl := b[1]
	if fl&^7 != 0 || le.Uint32(b[32:]) != 0 {
		return nil, fmt.Errorf("coherence: message has reserved bits set (flags %#x): %w", fl, ErrProtocol)
	}
	n := le.Uint32(b[8:])
	if n > MaxData || int(n) > len(b)-headerSize {
		return nil, fmt.Errorf("coherence: message data of %d bytes exceeds the %d-byte limit or the %d bytes left: %w", n, MaxData, len(b)-headerSize, ErrProtocol)
	}
	*m = Message{
		Kind:        Kind(b[0]),
		Exclusive:   fl&1 != 0,
		Downgrade:   fl&2 != 0,
		HasData:     fl&4 != 0,
		Mode:        Mode(b[2]),
		Code:        b[3],
		PageSize:    le.Uint32(b[4:]),
		From:        SharerID(le.Uint64(b[12:])),
		Incarnation: le.Uint64(b[20:]),
		Page:        le.Uint32(b[28:]),
		Seq:         le.Uint64(b[36:]),
		Gen:         le.Uint64(b[44:]),
		InvID:       le.Uint64(b[52:]),
		WBSeq:       le.Uint64(b[60:]),
		Lease:       time.Duration(le.Uint32(b[68:])) * time.Microsecond,
	}
	end := headerSize + int(n)
	if n > 0 {
		m.Data = b[headerSize:end:end]
	}
	return b[end:], nil
}

// AppendBatch appends the encoding of msgs (a count, then each message).
func AppendBatch(b []byte, msgs []Message) []byte {
	b = le.AppendUint32(b, uint32(len(msgs)))
	for i := range msgs {
		b = AppendMessage(b, &msgs[i])
	}
	return b
}

// DecodeBatch decodes a batch. The messages' Data alias b.
func DecodeBatch(b []byte) ([]Message, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("coherence: batch of %d bytes has no count: %w", len(b), ErrProtocol)
	}
	n := le.Uint32(b)
	if n > MaxBatch {
		return nil, fmt.Errorf("coherence: batch of %d messages exceeds the limit of %d: %w", n, MaxBatch, ErrProtocol)
	}
	b = b[4:]
	msgs := make([]Message, n)
	for i := range msgs {
		var err error
		if b, err = DecodeMessage(b, &msgs[i]); err != nil {
			return nil, err
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("coherence: %d bytes follow the batch's last message: %w", len(b), ErrProtocol)
	}
	return msgs, nil
}
