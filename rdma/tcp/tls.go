package tcp

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"time"
)

// polledConn is the socket under a TLS connection: crypto/tls reads the
// socket through r, which busy-polls it (see newBusyReader) once
// pollingReader has set it, so that busy polling works below TLS as it
// does on a plain connection. Before that (the TLS handshake) it reads
// the socket directly.
type polledConn struct {
	net.Conn
	r io.Reader // set by pollingReader before the first frame is read
}

func (p *polledConn) Read(b []byte) (int, error) {
	if p.r == nil {
		return p.Conn.Read(b)
	}
	return p.r.Read(b)
}

// pollingReader returns what a connection's frames are read from: nc,
// busy-polled as newBusyReader does; for a TLS connection over a
// polledConn, the TLS connection, its socket busy-polled underneath
// (records are decrypted by the reader's goroutine as they arrive).
func pollingReader(nc net.Conn, spin time.Duration, want func() bool) io.Reader {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return newBusyReader(nc, spin, want)
	}
	if pc, ok := tc.NetConn().(*polledConn); ok {
		pc.r = newBusyReader(pc.Conn, spin, want)
	}
	return tc
}

// batchWriter writes a batch of frames (header and payload buffers) to a
// connection: with one writev on a plain socket; on a TLS connection
// through a buffer of one full TLS record, so that a batch of small frames
// goes out as few full records (one seal and one write(2) each) rather
// than a record per buffer, and a large payload as full records written
// straight from it. Owned by the connection's writer.
type batchWriter struct {
	nc net.Conn
	bw *bufio.Writer // nil on a plain socket
}

// maxRecord is the most plaintext one TLS record carries.
const maxRecord = 16 << 10

func newBatchWriter(nc net.Conn) batchWriter {
	if _, ok := nc.(*tls.Conn); ok {
		return batchWriter{nc: nc, bw: bufio.NewWriterSize(nc, maxRecord)}
	}
	return batchWriter{nc: nc}
}

// write writes and consumes nb.
func (w batchWriter) write(nb *net.Buffers) error {
	if w.bw == nil {
		_, err := nb.WriteTo(w.nc)
		return err
	}
	if _, err := nb.WriteTo(w.bw); err != nil {
		return err
	}
	return w.bw.Flush()
}
