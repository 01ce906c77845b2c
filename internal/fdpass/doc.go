// Package fdpass is the small protocol by which a local client asks poold for
// a segment's memory and receives it as a file descriptor (SCM_RIGHTS), on the
// daemon's unix socket next to gRPC. It is also the local clients' fast path
// for allocating and freeing: one unix-socket round trip instead of a gRPC
// call (which costs several times more on small machines), with the new
// segment's descriptor in the same reply.
//
// A connection starts with the 4-byte magic "FMFD" (which is how the daemon
// tells it from gRPC's HTTP/2 preface), then carries request/response pairs:
//
//	request:  version u8 (=2) | op u8 | session length u16 | session bytes |
//	          body length u32 | body
//	response: reason length u8 | reason | message length u16 | message |
//	          offset i64 | length i64 | body length u32 | body
//	          (+ one descriptor as SCM_RIGHTS when the op maps memory and
//	          reason is empty)
//
// The ops and their bodies:
//
//	1 GET    request: segment id u64          reply: descriptor of the segment
//	2 ALLOC  request: an AllocRequest proto   reply: a Segment proto, and the
//	                                          descriptor unless it is an rdma segment
//	3 FREE   request: segment id u64          reply: nothing
//	4 RELEASE request: segment id u64         reply: nothing; the client
//	                                          no longer maps the segment
//
// Integers are big-endian. A response is sent with one sendmsg, so the
// descriptor arrives with its first byte. Sessions are at most 256 bytes,
// messages 4 KiB and bodies 64 KiB.
//
// A Conn is not safe for concurrent use; callers serialize requests on it.
// Linux only: elsewhere Dial and WriteResponse return errs.ErrNotSupported.
package fdpass
