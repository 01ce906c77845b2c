package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// TCPRaw is the network floor: a raw TCP read/write server on 127.0.0.1
// (in this process, or another one started with Serve), with no checks, keys or framing beyond an 8-byte
// request header, and a client that pipelines every in-flight op on one
// connection (leader/follower: the caller that finds nobody reading reads
// responses for everyone until its own arrives, so a lone op costs one
// write and one read, as with farmem's rdma transport). Safe for
// concurrent use.
//
//	request: op u8 (1 read, 2 write) | 0 u8 | key u16 | size u32 | write payload
//	response: read: size bytes; write: 8 bytes
type TCPRaw struct {
	srv *rawServer // nil when the server is another process
	cli *rawClient
	max int
	pid int
}

var _ System = (*TCPRaw)(nil)

const rawHeader = 8

// NewTCPRaw starts the server in this process for values of up to
// maxSize bytes and dials it.
func NewTCPRaw(maxSize int) (*TCPRaw, error) {
	srv, err := startRawServer(maxSize)
	if err != nil {
		return nil, err
	}
	t, err := DialTCPRaw(srv.l.Addr().String(), maxSize, 0)
	if err != nil {
		srv.close()
		return nil, err
	}
	t.srv = srv
	return t, nil
}

// DialTCPRaw connects to a tcp-raw server at addr that serves values of up
// to maxSize bytes (see Serve), run by process pid (0: unknown).
func DialTCPRaw(addr string, maxSize, pid int) (*TCPRaw, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp-raw: dial %s: %w", addr, err)
	}
	return &TCPRaw{cli: &rawClient{c: c, br: bufio.NewReaderSize(c, 64<<10)}, max: maxSize, pid: pid}, nil
}

// rawServer is the tcp-raw server.
type rawServer struct {
	l    net.Listener
	mem  []byte
	max  int
	wg   sync.WaitGroup
	mu   sync.Mutex
	cs   []net.Conn
	once sync.Once
}

func startRawServer(maxSize int) (*rawServer, error) {
	if maxSize <= 0 || maxSize > 16<<20 {
		return nil, fmt.Errorf("%w: tcp-raw value size %d: use 1 B to 16 MiB", ErrInvalid, maxSize)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcp-raw: listen on 127.0.0.1: %w", err)
	}
	s := &rawServer{l: l, mem: make([]byte, Keys*maxSize), max: maxSize}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *rawServer) addr() string { return s.l.Addr().String() }

func (s *rawServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.cs = append(s.cs, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serve answers requests in order, flushing the batched responses when
// no further complete request is buffered.
func (s *rawServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	bw := bufio.NewWriterSize(c, 256<<10)
	var hdr [rawHeader]byte
	var ack [8]byte
	for {
		if br.Buffered() < rawHeader && bw.Flush() != nil {
			return
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		key, n := int(binary.LittleEndian.Uint16(hdr[2:])), int(binary.LittleEndian.Uint32(hdr[4:]))
		if key >= Keys || n > s.max {
			return
		}
		slot := s.mem[key*n : key*n+n]
		var err error
		if hdr[0] == 2 {
			if _, err = io.ReadFull(br, slot); err == nil {
				_, err = bw.Write(ack[:])
			}
		} else {
			_, err = bw.Write(slot)
		}
		if err != nil {
			return
		}
	}
}

// close stops the server and waits for its goroutines. Idempotent.
func (s *rawServer) close() error {
	s.once.Do(func() {
		s.l.Close()
		s.mu.Lock()
		for _, c := range s.cs {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return nil
}

// Name is "tcp-raw".
func (t *TCPRaw) Name() string { return "tcp-raw" }

// Prepare checks the size; the server's memory is allocated up front.
func (t *TCPRaw) Prepare(_ context.Context, op Op, size int) error {
	if op == Atomic {
		return fmt.Errorf("tcp-raw has no atomics: %w", ErrNotSupported)
	}
	if size > t.max {
		return fmt.Errorf("%w: tcp-raw was started for values up to %d B, not %d", ErrInvalid, t.max, size)
	}
	return nil
}

// Do sends one request and waits for its response.
func (t *TCPRaw) Do(_ context.Context, op Op, key int, buf []byte) error {
	if op == Atomic {
		return ErrNotSupported
	}
	return t.cli.do(op, key, buf)
}

// ServerPID is the server's process when it is another one, else 0.
func (t *TCPRaw) ServerPID() int { return t.pid }

// Close closes the client and stops an in-process server. Idempotent.
func (t *TCPRaw) Close() error {
	t.cli.c.Close()
	if t.srv != nil {
		return t.srv.close()
	}
	return nil
}

// errLead hands the reader role to the call that receives it.
var errLead = errors.New("lead")

type rawCall struct {
	buf  []byte // read: the destination; write: nil (an 8-byte ack is read)
	done chan error
}

// rawClient pipelines calls on one connection. Calls are queued in the
// order their requests are written, which is the order of the responses.
type rawClient struct {
	c   net.Conn
	br  *bufio.Reader
	wmu sync.Mutex // serializes request writes and queueing

	qmu     sync.Mutex
	q       []*rawCall // awaiting a response, oldest first
	reading bool       // a caller holds the reader role
	broken  error
}

func (rc *rawClient) do(op Op, key int, buf []byte) error {
	call := &rawCall{done: make(chan error, 1)}
	var hdr [rawHeader]byte
	hdr[0] = 1
	bufs := net.Buffers{hdr[:]}
	if op == Write {
		hdr[0] = 2
		bufs = append(bufs, buf)
	} else {
		call.buf = buf
	}
	binary.LittleEndian.PutUint16(hdr[2:], uint16(key))
	binary.LittleEndian.PutUint32(hdr[4:], uint32(len(buf)))
	rc.wmu.Lock()
	rc.qmu.Lock()
	if rc.broken != nil {
		rc.qmu.Unlock()
		rc.wmu.Unlock()
		return rc.broken
	}
	rc.q = append(rc.q, call)
	lead := !rc.reading
	rc.reading = true
	rc.qmu.Unlock()
	_, err := bufs.WriteTo(rc.c)
	rc.wmu.Unlock()
	if err != nil {
		rc.fail(fmt.Errorf("tcp-raw: write: %w", err))
	}
	if !lead {
		if err := <-call.done; err != errLead {
			return err
		}
	}
	return rc.lead(call)
}

// lead reads responses in order, delivering them, until call's arrives,
// then hands the reader role to the oldest call still waiting.
func (rc *rawClient) lead(call *rawCall) error {
	var ack [8]byte
	for {
		rc.qmu.Lock()
		if rc.broken != nil {
			rc.qmu.Unlock()
			return rc.broken
		}
		head := rc.q[0]
		rc.q = rc.q[1:]
		rc.qmu.Unlock()
		dst := head.buf
		if dst == nil {
			dst = ack[:]
		}
		if _, err := io.ReadFull(rc.br, dst); err != nil {
			err = fmt.Errorf("tcp-raw: read: %w", err)
			rc.fail(err)
			if head != call {
				head.done <- err
			}
			return err
		}
		if head == call {
			break
		}
		head.done <- nil
	}
	rc.qmu.Lock()
	if len(rc.q) > 0 {
		rc.q[0].done <- errLead
	} else {
		rc.reading = false
	}
	rc.qmu.Unlock()
	return nil
}

// fail marks the connection broken and fails every queued call.
func (rc *rawClient) fail(err error) {
	rc.qmu.Lock()
	defer rc.qmu.Unlock()
	if rc.broken == nil {
		rc.broken = err
		rc.c.Close()
	}
	for _, c := range rc.q {
		select {
		case c.done <- err:
		default:
		}
	}
	rc.q = nil
}
