package tcp

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The data plane's sockets are non-blocking, so a read or write of one
// returns as soon as the kernel has copied what it could: it never waits.
// They are made with raw system calls, which skip the runtime's syscall
// entry and exit. That entry wakes the runtime's monitor thread (sysmon)
// whenever it sleeps because the process was idle, and resets it to
// polling every 20 µs for the next millisecond; a process whose goroutines
// wait on the network between short bursts of socket calls, as a client
// at a few operations in flight does, kept it awake, a thread switch every
// 20 µs (a tenth of memctl bench's CPU samples at 16 in flight). A raw
// call holds its P (and holds up a stop of the world for the collector)
// for the copy, as Go code would: so writes are raw only for batches of
// at most rawMaxWrite bytes, whose copy takes microseconds (a batch's
// payloads may be mapped segment memory, and a page of it faulted in from
// swap or a file would stop the process for as long); larger ones, where
// the call's own cost is small beside the copy, take the runtime's path.
// A socket that is not non-blocking (something set it blocking through a
// dup of its descriptor) is read and written the runtime's way too.

// rawRead reads fd once into p, which is not empty.
func rawRead(fd uintptr, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// maxIovecs is how many buffers one writev takes (the kernel's UIO_MAXIOV).
const maxIovecs = 1024

// rawMaxWrite is the largest batch written with raw writev calls.
const rawMaxWrite = 64 << 10

// nonBlockingTCP returns the RawConn of nc when nc is a TCP connection in
// non-blocking mode, where a raw read or write cannot wait.
func nonBlockingTCP(nc net.Conn) (syscall.RawConn, bool) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, false
	}
	var fl int
	if cerr := rc.Control(func(fd uintptr) { fl, err = unix.FcntlInt(fd, unix.F_GETFL, 0) }); cerr != nil || err != nil {
		return nil, false
	}
	return rc, fl&unix.O_NONBLOCK != 0
}

// rawWriter writes batches of buffers to a TCP connection with raw
// writev calls, waiting in the runtime's poller when the socket's buffer
// is full, as net.Buffers.WriteTo would. It belongs to the holder of the
// connection's write role and is not safe for concurrent use.
type rawWriter struct {
	nc  net.Conn
	rc  syscall.RawConn
	iov []unix.Iovec
	// The write in progress, for try (a method value made once, so a
	// write allocates nothing).
	nb  *net.Buffers
	err error
	fn  func(fd uintptr) bool
}

// rawWrites returns a function that writes and consumes a batch of
// buffers on nc, with raw writev calls when it is small (rawMaxWrite), or
// nil when nc is not a non-blocking TCP connection.
func rawWrites(nc net.Conn) func(*net.Buffers) error {
	rc, ok := nonBlockingTCP(nc)
	if !ok {
		return nil
	}
	w := &rawWriter{nc: nc, rc: rc}
	w.fn = w.try
	return w.write
}

// write writes and consumes nb.
func (w *rawWriter) write(nb *net.Buffers) error {
	var n int
	for _, b := range *nb {
		if n += len(b); n > rawMaxWrite {
			_, err := nb.WriteTo(w.nc)
			return err
		}
	}
	w.nb, w.err = nb, nil
	defer func() { w.nb = nil }()
	for w.err == nil && len(*nb) > 0 {
		if err := w.rc.Write(w.fn); err != nil {
			return err
		}
	}
	return w.err
}

// try is the RawConn callback: it writes until nb is empty or the socket
// is full (false: the poller waits until it is writable).
func (w *rawWriter) try(fd uintptr) bool {
	for {
		nb := *w.nb
		iov := w.iov[:0]
		for _, b := range nb {
			if len(iov) == maxIovecs {
				break
			}
			if len(b) > 0 {
				v := unix.Iovec{Base: unsafe.SliceData(b)}
				v.SetLen(len(b))
				iov = append(iov, v)
			}
		}
		w.iov = iov
		if len(iov) == 0 {
			*w.nb = nb[:0]
			return true
		}
		n, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		clear(iov) // drop the references to the caller's buffers
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			return false
		case e != 0:
			w.err = &net.OpError{Op: "writev", Net: "tcp", Source: w.nc.LocalAddr(), Addr: w.nc.RemoteAddr(), Err: os.NewSyscallError("writev", e)}
			return true
		case n == 0:
			// Nothing written and no error: as net.Buffers does, an error
			// rather than a loop that never ends.
			w.err = &net.OpError{Op: "writev", Net: "tcp", Source: w.nc.LocalAddr(), Addr: w.nc.RemoteAddr(), Err: io.ErrUnexpectedEOF}
			return true
		}
		consume(w.nb, int(n))
		if len(*w.nb) == 0 {
			return true
		}
	}
}

// consume drops the first n bytes of nb, as net.Buffers does internally.
func consume(nb *net.Buffers, n int) {
	for len(*nb) > 0 {
		b := (*nb)[0]
		if n < len(b) {
			(*nb)[0] = b[n:]
			return
		}
		n -= len(b)
		(*nb)[0] = nil
		*nb = (*nb)[1:]
	}
}
