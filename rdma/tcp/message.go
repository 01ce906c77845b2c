package tcp

import (
	"context"
	"errors"
	"fmt"

	"github.com/farmem/farmem/rdma"
)

// MSG (opcode 5) carries an opaque request to the server's Message hook and
// its response back: the coherence protocol of shared segments rides it.
// The request payload is the message (at most MaxMessage bytes); length is
// the largest response the client accepts; offset, arg0 and arg1 are 0.
// The response payload (at most length bytes) is the hook's answer.

// opKindMessage is the op kind of a MSG on the client side. It is not an
// rdma.OpKind a caller may pass to Do.
const opKindMessage = rdma.OpKind(opMsg)

// MaxMessage is the largest MSG request (1 MiB + 64 KiB): the largest
// coherence message, a page of the largest page size (1 MiB) with its
// header, or a poll carrying a batch of acks without data (at most 4096
// of 72 bytes), with room to spare. A server answers a longer one
// OUT_OF_RANGE, so that a client that never sends such messages cannot
// make it buffer MaxPayload per connection. An answer may be as long as
// MaxPayload.
const MaxMessage = 1<<20 + 64<<10

// MessageCall is one MSG request as ServerConfig.Message gets it. A value;
// its slices are valid only during the call.
type MessageCall struct {
	// Seg is the segment's id, Mem its mapped memory, pinned for the call.
	Seg uint64
	Mem []byte
	// Req is the request payload.
	Req []byte
	// MaxResp is the largest answer the client accepts.
	MaxResp int
	// Writable says whether the connection may write the segment: a
	// reader's MSG must not change its memory.
	Writable bool
	// Principal is the connection's principal (ServerConfig.Identify), ""
	// on a connection that was not identified: a protocol above that
	// names its participants binds each name to the principal that used
	// it, so that one client cannot speak as another.
	Principal string
}

// Message implements rdma.Conn.Message with the MSG opcode: it sends req to
// the Message hook of the server for region r and reads its answer into
// resp, returning the answer's length. An answer
// longer than resp fails the connection with ErrProtocol; size resp for the
// largest answer the protocol above allows. A server whose hook blocks (a
// long poll) holds up every op behind it on that connection, so such calls
// belong on a Client of their own.
func (cl *Client) Message(ctx context.Context, r rdma.Region, req, resp []byte) (int, error) {
	if len(req) > MaxMessage || len(resp) > MaxPayload {
		return 0, fmt.Errorf("rdma/tcp: MSG %s of %d bytes with a %d-byte answer buffer exceeds the limits (%d-byte request, MaxMessage; %d-byte answer, MaxPayload): %w", r, len(req), len(resp), MaxMessage, MaxPayload, rdma.ErrOutOfRange)
	}
	o := getOp()
	o.kind, o.region, o.req, o.buf = opKindMessage, r, req, resp
	o.off, o.arg0, o.arg1 = 0, 0, 0 // pooled ops keep the last use's
	err := cl.run(ctx, o)
	if err == nil {
		err = o.err
	}
	n := o.n
	o.release()
	if err != nil {
		return 0, err
	}
	return n, nil
}

// completeMessage reads a MSG response payload into the caller's buffer.
func (c *cliConn) completeMessage(o *op, h *respHeader) error {
	o.n = int(h.payloadLen)
	if err := c.rd.readInto(o.buf[:o.n]); err != nil {
		o.err = fmt.Errorf("rdma/tcp: MSG segment %d: connection to %s broke mid-payload: %w: %w", o.region.Segment, c.cl.addr, rdma.ErrClosed, err)
		return fmt.Errorf("read MSG payload: %w", err)
	}
	return nil
}

// message serves one MSG. Its length and segment are checked before its
// payload is read: a payload over MaxMessage is answered OUT_OF_RANGE, a
// segment the connection may not use as pin answers, and the payload is
// skipped without a buffer. Otherwise the payload is read into a buffer of
// its own (the hook may keep the connection's goroutine for long), with
// the segment unpinned so that a client slow to send it holds up no
// Revoke; pending responses are flushed (the hook may block), then the
// hook runs with the segment pinned again.
func (c *srvConn) message(h *reqHeader) error {
	st := statusOutOfRange
	if h.payloadLen <= MaxMessage {
		var e *export
		if e, st = c.pin(h, false); st == statusOK {
			e.release()
		}
	}
	if st != statusOK {
		// Answered first: the answer leaves while the payload is skipped.
		if err := c.respond(h.id, st, 0, 0, nil, nil); err != nil {
			return err
		}
		return c.discard(int(h.payloadLen))
	}
	req := make([]byte, h.payloadLen)
	if err := c.rd.readInto(req); err != nil {
		return fmt.Errorf("read %d-byte MSG payload: %w", len(req), err)
	}
	e, st := c.pin(h, false)
	if st != statusOK {
		return c.respond(h.id, st, 0, 0, nil, nil)
	}
	if err := c.flush(); err != nil {
		e.release()
		return err
	}
	resp, err := c.s.cfg.Message(c.s.ctx, MessageCall{Seg: h.seg, Mem: e.mem, Req: req, MaxResp: int(h.length),
		Writable: c.permits(e, true), Principal: c.principal})
	e.release()
	if err == nil && len(resp) > int(h.length) {
		err = fmt.Errorf("MSG answer of %d bytes exceeds the client's %d: %w", len(resp), h.length, rdma.ErrProtocol)
	}
	if err != nil {
		c.log.Debug("rdma/tcp: MSG refused", "remote", c.remote, "segment", h.seg, "err", err)
		return c.respond(h.id, msgStatus(err), 0, 0, nil, nil)
	}
	return c.respond(h.id, statusOK, 0, 0, resp, nil)
}

// msgStatus maps a Message hook's error to a response status.
func msgStatus(err error) uint16 {
	for _, m := range []struct {
		err    error
		status uint16
	}{
		{rdma.ErrAccessDenied, statusAccessDenied},
		{rdma.ErrOutOfRange, statusOutOfRange},
		{rdma.ErrSegmentLost, statusSegmentLost},
		{rdma.ErrLeaseExpired, statusLeaseExpired},
		{rdma.ErrNotSupported, statusUnsupported},
	} {
		if errors.Is(err, m.err) {
			return m.status
		}
	}
	return statusProtocol
}
