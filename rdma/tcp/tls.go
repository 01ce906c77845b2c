package tcp

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"time"
)

// polledConn is the socket under a TLS connection. crypto/tls reads a
// socket about one record per read(2) and writes one record per write(2);
// on the data plane that is most of the cost of TLS (a 1 MiB response is
// 64 records), so polledConn reads the socket through a buffer of
// tlsReadBuffer bytes, busy-polled once pollingReader has set it up (so
// busy polling works below TLS as on a plain connection), and gathers the
// records of one batch (cork to uncork, see batchWriter) into one write.
// Before pollingReader (the TLS handshake) it reads and writes the socket
// directly. Its reads belong to the connection's reader; writes are
// serialised by mu (crypto/tls may answer a key update from the reader's
// goroutine).
type polledConn struct {
	net.Conn
	in *bufio.Reader // set by pollingReader before the first frame is read

	mu     sync.Mutex
	corked bool                     // writes gather in out until uncork
	out    []byte                   // records gathered while corked
	raw    func(*net.Buffers) error // writes the gathered records (rawWrites); nil: p.Conn.Write
	one    net.Buffers              // p.out, for raw
}

// newPolledConn returns the polledConn of socket nc.
func newPolledConn(nc net.Conn) *polledConn { return &polledConn{Conn: nc, raw: rawWrites(nc)} }

const (
	// tlsReadBuffer is how much one read(2) of a TLS connection's socket
	// takes in at most.
	tlsReadBuffer = 64 << 10
	// maxCork is how many bytes of records a corked connection gathers
	// before it writes them anyway.
	maxCork = 256 << 10
)

func (p *polledConn) Read(b []byte) (int, error) {
	if p.in == nil {
		return p.Conn.Read(b)
	}
	return p.in.Read(b)
}

func (p *polledConn) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.corked {
		return p.Conn.Write(b)
	}
	p.out = append(p.out, b...)
	if len(p.out) >= maxCork {
		if err := p.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (p *polledConn) cork() {
	p.mu.Lock()
	p.corked = true
	p.mu.Unlock()
}

// uncork writes the gathered records and writes directly from then on.
func (p *polledConn) uncork() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.corked = false
	return p.flushLocked()
}

func (p *polledConn) flushLocked() error {
	if len(p.out) == 0 {
		return nil
	}
	var err error
	if p.raw != nil {
		p.one = append(p.one[:0], p.out)
		err = p.raw(&p.one)
	} else {
		_, err = p.Conn.Write(p.out)
	}
	p.out = p.out[:0]
	return err
}

// pollingReader returns what a connection's frames are read from: nc,
// busy-polled as newBusyReader does; for a TLS connection over a
// polledConn, the TLS connection, its socket read through a buffer and
// busy-polled underneath (records are decrypted by the reader's goroutine
// as they arrive).
func pollingReader(nc net.Conn, spin time.Duration, want func() int) io.Reader {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return newBusyReader(nc, spin, want)
	}
	if pc, ok := tc.NetConn().(*polledConn); ok {
		pc.in = bufio.NewReaderSize(newBusyReader(pc.Conn, spin, want), tlsReadBuffer)
	}
	return tc
}

// batchWriter writes a batch of frames (header and payload buffers) to a
// connection: with one writev on a plain socket; on a TLS connection
// through a buffer of one full TLS record, so that a batch of small frames
// is sealed as few full records rather than a record per buffer (a large
// payload is sealed straight from where it is), the records of the batch
// then written together (polledConn's cork). Owned by the connection's
// writer.
type batchWriter struct {
	nc  net.Conn
	raw func(*net.Buffers) error // on a plain TCP socket where raw writes are made (rawWrites), else nil
	bw  *bufio.Writer            // nil on a plain socket
	pc  *polledConn              // the TLS connection's socket; nil on a plain socket
}

// maxRecord is the most plaintext one TLS record carries.
const maxRecord = 16 << 10

func newBatchWriter(nc net.Conn) batchWriter {
	tc, ok := nc.(*tls.Conn)
	if !ok {
		return batchWriter{nc: nc, raw: rawWrites(nc)}
	}
	pc, _ := tc.NetConn().(*polledConn)
	return batchWriter{nc: nc, bw: bufio.NewWriterSize(nc, maxRecord), pc: pc}
}

// write writes and consumes nb. A payload in a mapping that faults while
// crypto/tls seals it is errFault (on a plain socket, writev's EFAULT):
// the connection must then be closed. The calling goroutine must have
// SetPanicOnFault(true) when nb holds mapped memory.
func (w batchWriter) write(nb *net.Buffers) (err error) {
	if w.raw != nil {
		return w.raw(nb)
	}
	if w.bw == nil {
		_, err = nb.WriteTo(w.nc)
		return err
	}
	defer func() {
		if p := recover(); p != nil {
			if !isFault(p) {
				panic(p)
			}
			err = errFault
		}
	}()
	if w.pc != nil {
		w.pc.cork()
	}
	_, err = nb.WriteTo(w.bw)
	if err == nil {
		err = w.bw.Flush()
	}
	if w.pc != nil {
		if uerr := w.pc.uncork(); err == nil {
			err = uerr
		}
	}
	return err
}
