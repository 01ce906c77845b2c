package tcp

import (
	"fmt"
	"strings"

	"github.com/farmem/farmem/rdma"
)

// Exactly-once across failover: a primary forwards a client's exactly-once
// op to its backups with an origin block (request flag FORWARD) naming the
// client's session, slot and sequence number and the primary's answer; a
// backup stores that answer in its reply cache as if the client had sent
// the op to it, so the client's retry there after a failover is answered
// from the cache instead of being applied a second time.

// originSize is the fixed part of an origin block; the session owner's
// name follows it.
const originSize = 40

// MaxOriginName is the longest session owner name an origin block carries:
// "p:" or "c:" and a principal or credential (MaxCredential bytes).
const MaxOriginName = 2 + MaxCredential

// origin is a decoded origin block: the client op a forwarded op stems
// from and the answer the primary gave it.
type origin struct {
	key    sessionKey // the client's session: owner name and id
	slot   uint16
	seq    uint32
	status uint16
	flags  uint8
	value  uint64
}

// appendOrigin appends o's origin block to b.
func appendOrigin(b []byte, o *origin) []byte {
	var h [originSize]byte
	copy(h[0:16], o.key.id[:])
	le.PutUint16(h[16:], o.slot)
	le.PutUint16(h[18:], o.status)
	le.PutUint32(h[20:], o.seq)
	le.PutUint64(h[24:], o.value)
	h[32] = o.flags
	le.PutUint16(h[34:], uint16(len(o.key.name)))
	b = append(b, h[:]...)
	return append(b, o.key.name...)
}

// decodeOrigin parses an origin block that fills b. It fails on reserved
// bytes that are not zero, a name whose length contradicts b or that names
// neither a principal nor a credential, a slot past rdma.SessionSlots, or
// response flags no response defines.
func decodeOrigin(b []byte) (origin, error) {
	if len(b) < originSize {
		return origin{}, fmt.Errorf("origin block is %d bytes, want at least %d: %w", len(b), originSize, rdma.ErrProtocol)
	}
	if b[33] != 0 || le.Uint32(b[36:]) != 0 {
		return origin{}, fmt.Errorf("origin block reserved bytes are not zero: %w", rdma.ErrProtocol)
	}
	o := origin{
		slot:   le.Uint16(b[16:]),
		status: le.Uint16(b[18:]),
		seq:    le.Uint32(b[20:]),
		value:  le.Uint64(b[24:]),
		flags:  b[32],
	}
	copy(o.key.id[:], b[0:16])
	n := int(le.Uint16(b[34:]))
	if n != len(b)-originSize || n > MaxOriginName {
		return origin{}, fmt.Errorf("origin block names a %d-byte owner in %d bytes: %w", n, len(b)-originSize, rdma.ErrProtocol)
	}
	o.key.name = string(b[originSize:])
	if !strings.HasPrefix(o.key.name, "p:") && !strings.HasPrefix(o.key.name, "c:") {
		return origin{}, fmt.Errorf("origin block owner names neither a principal (p:) nor a credential (c:): %w", rdma.ErrProtocol)
	}
	if int(o.slot) >= rdma.SessionSlots {
		return origin{}, fmt.Errorf("origin block slot %d is past the %d slots of a session: %w", o.slot, rdma.SessionSlots, rdma.ErrProtocol)
	}
	if o.flags&^respFlagSwapped != 0 {
		return origin{}, fmt.Errorf("origin block response flags %#x are not defined: %w", o.flags, rdma.ErrProtocol)
	}
	return o, nil
}

// namesForwarder reports whether key is a session of a principal that
// ServerConfig.Forwarders lets forward; false without Forwarders.
func (s *Server) namesForwarder(key sessionKey) bool {
	principal, ok := strings.CutPrefix(key.name, "p:")
	return ok && s.cfg.Forwarders != nil && s.cfg.Forwarders(principal)
}

// remember stores o's answer in the reply cache of its client's session,
// opening the session if it is new (openForwarded), unless the slot
// already holds a later sequence number. A slot another op holds (the
// client's own op on it here, whose payload may be slow to come: at most
// FrameTimeout) gets it once that op is done, on a goroutine of its own:
// the forwarder's connection, which carries every client's forwarded ops
// (maybe under the segment's forwarding lock), does not wait for it. One
// goroutine per slot waits, and records the newest answer that came
// meanwhile (a later one replaces an earlier: the cache keeps only a
// slot's last), so a client holding its slot while forwarded ops for it
// pour in costs one goroutine and one answer, not one each.
func (t *sessionTable) remember(o *origin) {
	sess := t.openForwarded(o.key)
	sl := &sess.slots[o.slot]
	if sl.mu.TryLock() {
		sl.recordNewer(o)
		sl.mu.Unlock()
		return
	}
	later := *o
	for {
		cur := sl.pending.Load()
		if cur != nil && int32(cur.seq-later.seq) > 0 || sl.pending.CompareAndSwap(cur, &later) {
			break
		}
	}
	if !sl.waiter.CompareAndSwap(false, true) {
		return // the waiting goroutine records it
	}
	go func() {
		sl.mu.Lock()
		sl.waiter.Store(false)
		if p := sl.pending.Swap(nil); p != nil {
			sl.recordNewer(p)
		}
		sl.mu.Unlock()
	}()
}

// recordNewer records o's answer unless the slot holds a later sequence
// number; sl.mu is held.
func (sl *slot) recordNewer(o *origin) {
	if !sl.known || int32(o.seq-sl.seq) >= 0 {
		sl.record(o.seq, o.status, o.flags, o.value)
	}
}
