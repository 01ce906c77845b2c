package tcp

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spinners counts the goroutines of this process that are busy-polling a
// socket right now; at most maxSpinners spin at once, so polling never
// takes more than half the cores from the work it waits for.
var spinners atomic.Int32

// maxMiss caps the backoff: after a miss the reader skips spinning for
// 2^miss reads of the same class.
const maxMiss = 8

// preemptedGap is a pause between two polls that only being descheduled
// explains (one poll is a system call of a few microseconds).
const preemptedGap = 200 * time.Microsecond

func maxSpinners() int32 { return int32(max(runtime.GOMAXPROCS(0)/2, 1)) }

// busyReader reads a TCP connection, busy-polling the socket for up to spin
// before the goroutine parks in the runtime's network poller. Parking and
// being woken cost two context switches, an epoll_wait and a futex wake;
// on a VM each is several microseconds, more than a loopback round trip's
// own work. When the answer comes within spin (a request/response at one
// in flight) the reader finds it without sleeping; when it does not (an
// idle connection) the reader parks as net.Conn.Read would, and backs off:
// after k misses in a row it skips spinning for the next 2^k reads (at
// most 256) of the same class, so an idle or slow peer costs almost no
// polling. A reader descheduled while it polls (the cores have other work)
// backs off the most at once, in every class.
//
// want, asked at each Read, says whether spinning is worth it now, and for
// which class of wait (spinClassOf), or noSpin: only while the connection
// carries one request at a time is the caller's core otherwise idle while
// it waits; with more in flight the wait is short anyway and a spinning
// core would take CPU from the work that answers.
//
// Deadlines and Close work as with net.Conn.Read: they take effect when a
// spin ends, at most spin later. A busyReader is owned by one goroutine at
// a time (the frameReader's) and is not safe for concurrent use.
type busyReader struct {
	nc   net.Conn
	rc   syscall.RawConn
	spin time.Duration
	want func() int
	gap  time.Duration // preemptedGap; tests raise it
	back [spinClasses]backoff

	class int // the class of the Read in progress, when it polls

	// State of the Read in progress, for tryRead (a method value made
	// once, so a Read allocates nothing).
	buf     []byte
	n       int
	err     error
	poll    bool // the next try polls for up to spin before it parks
	tryRead func(fd uintptr) bool
}

// backoff is a busyReader's state for one class of waits.
type backoff struct {
	skip int // reads left before spinning again
	miss int // spins in a row that found nothing
}

// classBackoff is the backoff of the class of the Read in progress, which polls.
func (r *busyReader) classBackoff() *backoff { return &r.back[r.class-1] }

// newBusyReader returns a reader of nc that busy-polls for up to spin
// when want says so (spin <= 0: never), reading with raw system calls
// (rawRead), or nc itself when nc is not a non-blocking TCP connection.
func newBusyReader(nc net.Conn, spin time.Duration, want func() int) io.Reader {
	rc, ok := nonBlockingTCP(nc)
	if !ok {
		return nc
	}
	r := &busyReader{nc: nc, rc: rc, spin: spin, want: want, gap: preemptedGap}
	r.tryRead = r.try
	return r
}

func (r *busyReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	spin := false
	if r.spin > 0 {
		if r.class = r.want(); r.class != noSpin {
			b := r.classBackoff()
			spin = b.skip == 0
			if !spin {
				b.skip--
			}
		}
	}
	// Without polling, try reads once and parks, as net.Conn.Read would.
	r.buf, r.n, r.err, r.poll = p, 0, nil, spin
	err := r.rc.Read(r.tryRead)
	r.buf = nil
	if err == nil {
		err = r.err
	}
	return r.n, err
}

// try is the RawConn callback: it reads what is there and reports true, or
// reports false to park until the socket is readable. On its first call
// of a Read that polls, it polls for up to r.spin first.
func (r *busyReader) try(fd uintptr) bool {
	first := r.poll
	r.poll = false
	spinning := false
	var last, until time.Time
	for {
		n, err := rawRead(fd, r.buf)
		switch {
		case err == nil && n > 0:
			r.n = n
		case err == nil:
			r.err = io.EOF
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			if !first {
				return false
			}
			if !spinning {
				if spinners.Add(1) > maxSpinners() {
					spinners.Add(-1)
					return false
				}
				last = time.Now()
				spinning, until = true, last.Add(r.spin)
				continue
			}
			now := time.Now()
			preempted := now.Sub(last) > r.gap
			if !preempted && now.Before(until) {
				last = now
				continue
			}
			spinners.Add(-1)
			if preempted {
				// Another thread wanted this core: the cores are busy,
				// and polling, whatever for, would only take CPU from the
				// work it waits for. Every class backs off the most.
				for i := range r.back {
					r.back[i] = backoff{miss: maxMiss, skip: 1 << maxMiss}
				}
				return false
			}
			b := r.classBackoff()
			b.miss = min(b.miss+1, maxMiss)
			b.skip = 1 << b.miss
			return false
		default:
			r.err = &net.OpError{Op: "read", Net: "tcp", Source: r.nc.LocalAddr(), Addr: r.nc.RemoteAddr(), Err: os.NewSyscallError("read", err)}
		}
		if spinning {
			spinners.Add(-1)
			r.classBackoff().miss = 0
		}
		return true
	}
}
