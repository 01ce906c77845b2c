package tcp

import (
	"fmt"
	"time"

	"github.com/farmem/farmem/rdma"
)

// Observation describes one operation the server completed, for
// ServerConfig.Observe. A plain value; the hook may keep it.
type Observation struct {
	// Op is the operation. An opcode this server does not know is passed
	// through as rdma.OpKind(opcode) with Status StatusUnsupported.
	Op rdma.OpKind
	// Bytes is the payload moved: the bytes read, written or XORed, 8 for
	// an atomic, 0 when Status is not StatusOK.
	Bytes int
	// Duration runs from the request header being decoded to the response
	// being queued: the checks, the copy or atomic, and for a WRITE the
	// receipt of its payload. It excludes the flush of responses to the
	// socket (one flush serves a batch), except for the response that fills
	// a batch and so flushes it. An op on a forwarding segment is observed
	// once it was applied and handed to its targets; the wait for their
	// acknowledgements, which its answer waits for, is not in it.
	Duration time.Duration
	// Status is the outcome sent to the client.
	Status OpStatus
}

// OpStatus is the outcome of one served operation, as the client is told
// it. The values are the protocol's response status codes (see doc.go). A
// plain value, safe to copy and compare.
type OpStatus uint16

// The outcomes an Observe hook sees.
const (
	// StatusOK: the operation was done.
	StatusOK = OpStatus(statusOK)
	// StatusAccessDenied: unknown segment, wrong key, or segment revoked.
	StatusAccessDenied = OpStatus(statusAccessDenied)
	// StatusOutOfRange: offset and length fall outside the segment.
	StatusOutOfRange = OpStatus(statusOutOfRange)
	// StatusSegmentLost: the segment's memory is gone (marked lost or faulted).
	StatusSegmentLost = OpStatus(statusSegmentLost)
	// StatusLeaseExpired: a mutating operation carried an older epoch.
	StatusLeaseExpired = OpStatus(statusLeaseExpired)
	// StatusUnaligned: an atomic at an offset that is not a multiple of 8.
	StatusUnaligned = OpStatus(statusUnaligned)
	// StatusUnsupported: an opcode or flag this server does not know.
	StatusUnsupported = OpStatus(statusUnsupported)
	// StatusIndeterminate: an exactly-once retry whose answer the server
	// no longer holds (the session's reply cache was evicted or lost).
	StatusIndeterminate = OpStatus(statusIndeterminate)
)

// String returns a short lower-case name, fit for a metric label.
func (s OpStatus) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusAccessDenied:
		return "access_denied"
	case StatusOutOfRange:
		return "out_of_range"
	case StatusSegmentLost:
		return "segment_lost"
	case StatusLeaseExpired:
		return "lease_expired"
	case StatusUnaligned:
		return "unaligned"
	case StatusUnsupported:
		return "unsupported"
	case StatusIndeterminate:
		return "indeterminate"
	default:
		return fmt.Sprintf("status_%d", uint16(s))
	}
}

// opStart reads the clock for Observe; without a hook it costs a nil check.
func (c *srvConn) opStart() time.Time {
	if c.s.cfg.Observe == nil {
		return time.Time{}
	}
	return time.Now()
}

// observe reports the operation h, whose response was just queued with
// c.status, to the Observe hook.
func (c *srvConn) observe(h *reqHeader, start time.Time) {
	obs := c.s.cfg.Observe
	if obs == nil {
		return
	}
	o := Observation{Op: rdma.OpKind(h.op), Status: OpStatus(c.status), Duration: time.Since(start)}
	if o.Status == StatusOK {
		switch h.op {
		case opRead:
			o.Bytes = int(h.length)
		case opWrite, opXor:
			o.Bytes = int(h.length)
		case opCAS, opFADD:
			o.Bytes = 8
		}
	}
	obs(o)
}
