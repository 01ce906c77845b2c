package fdpass

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Conn is the client side of a descriptor-passing connection. It is not
// safe for concurrent use: callers serialize requests on it.
type Conn struct {
	c   *net.UnixConn
	buf []byte
	oob []byte
}

// Dial connects to the daemon's socket and sends the magic.
func Dial(path string) (*Conn, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(Magic)); err != nil {
		c.Close()
		return nil, err
	}
	return &Conn{c: c, buf: make([]byte, MaxBody+8192), oob: make([]byte, unix.CmsgSpace(4))}, nil
}

// Do sends one request and reads its response; deadline bounds the whole
// exchange.
func (c *Conn) Do(req Request, deadline time.Time) (Response, error) {
	b, err := AppendRequest(nil, req)
	if err != nil {
		return Response{}, err
	}
	if err := c.c.SetDeadline(deadline); err != nil {
		return Response{}, err
	}
	if _, err := c.c.Write(b); err != nil {
		return Response{}, err
	}
	n, oobn, _, _, err := c.c.ReadMsgUnix(c.buf, c.oob)
	if err != nil {
		return Response{}, err
	}
	var fd = -1
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn])
		if perr == nil && len(msgs) == 1 {
			fds, rerr := unix.ParseUnixRights(&msgs[0])
			if rerr == nil && len(fds) > 0 {
				fd = fds[0]
				for _, extra := range fds[1:] {
					unix.Close(extra)
				}
			}
		}
	}
	resp, err := decodeResponse(c.buf[:n])
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return Response{}, err
	}
	if resp.Err == nil && fd >= 0 {
		resp.File = os.NewFile(uintptr(fd), fmt.Sprintf("farmem-segment-%d", req.Segment))
	} else if fd >= 0 {
		unix.Close(fd)
	}
	if resp.Err == nil && req.Op == OpGet && resp.File == nil {
		return Response{}, fmt.Errorf("%w: success without a descriptor", ErrProtocol)
	}
	return resp, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// WriteResponse sends a response on the daemon's side; f, when not nil, is
// sent as SCM_RIGHTS (only with a nil err). The caller keeps ownership of f.
func WriteResponse(c *net.UnixConn, err error, f *os.File, off, length int64, body []byte) error {
	b := encodeResponse(err, off, length, body)
	var oob []byte
	if err == nil && f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_, _, werr := c.WriteMsgUnix(b, oob, nil)
	return werr
}

// PeerCred returns the uid, gid and pid of the process at the other end.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}
