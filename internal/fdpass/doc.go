// Package fdpass is the small protocol by which a local client asks poold for
// a segment's memory and receives it as a file descriptor (SCM_RIGHTS), on the
// daemon's unix socket next to gRPC.
//
// A connection starts with the 4-byte magic "FMFD" (which is how the daemon
// tells it from gRPC's HTTP/2 preface), then carries request/response pairs:
//
//	request:  version u8 (=1) | session length u16 | session bytes | segment id u64
//	response: reason length u8 | reason | message length u16 | message |
//	          offset i64 | length i64        (+ one descriptor as SCM_RIGHTS when reason is empty)
//
// Integers are big-endian. A response is sent with one sendmsg, so the
// descriptor arrives with its first byte. Sessions are at most 256 bytes,
// messages at most 4 KiB.
//
// A Conn is not safe for concurrent use; callers serialize requests on it.
// Linux only: elsewhere Dial and Serve return errs.ErrNotSupported.
package fdpass
