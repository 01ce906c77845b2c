package uevent

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelGroup is the multicast group the kernel sends uevents to; udev
// re-broadcasts on group 2.
const kernelGroup = 1

// rcvBuf is the receive buffer asked for: a region's creation sends a few
// dozen events, a memory block storm (onlining 256 MiB in 128 MiB blocks of
// a large device) hundreds; 1 MiB holds several thousand.
const rcvBuf = 1 << 20

// Socket is a NETLINK_KOBJECT_UEVENT socket bound to the kernel's group.
// Receive is for one goroutine at a time; Close may be called from any
// goroutine, also while Receive blocks. Close is idempotent.
type Socket struct {
	f *os.File // non-blocking, so the runtime's poller wakes Receive on Close
}

// Listen opens a socket that receives the kernel's uevents of this network
// namespace.
func Listen() (*Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent: open a NETLINK_KOBJECT_UEVENT socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: kernelGroup}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("uevent: bind the uevent socket to the kernel's group: %w", err)
	}
	// Beyond rmem_max only with CAP_NET_ADMIN; the default buffer is a
	// fallback, and an overflow is reported, not silent.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
	return &Socket{f: os.NewFile(uintptr(fd), "uevent")}, nil
}

// Receive reads one datagram from the kernel into buf (MaxMessage bytes
// hold any) and returns its length. Datagrams from a process rather than
// the kernel are skipped. An overflowed receive buffer returns an error
// matching ErrOverflow (read on afterwards); a closed socket one matching
// os.ErrClosed.
func (s *Socket) Receive(buf []byte) (int, error) {
	rc, err := s.f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("uevent: receive: %w", err) // matches os.ErrClosed
	}
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		switch {
		case err != nil: // the socket was closed: the only error the poller gives here
			return 0, fmt.Errorf("uevent: receive: %w (%w)", os.ErrClosed, err)
		case errors.Is(rerr, unix.ENOBUFS):
			return 0, fmt.Errorf("%w: %w", ErrOverflow, rerr)
		case rerr != nil:
			return 0, fmt.Errorf("uevent: receive: %w", rerr)
		}
		if sa, ok := from.(*unix.SockaddrNetlink); ok && sa.Pid != 0 {
			continue // a process's datagram, not the kernel's
		}
		return n, nil
	}
}

// Inject has the kernel broadcast msg (an encoded Event, without SEQNUM:
// the kernel appends one) to every uevent listener of the calling thread's
// network namespace, as if a device had sent it (Linux 4.18 or later;
// CAP_SYS_ADMIN). Tests use it to reach a real listener; run it in a
// network namespace of the test's own, where no udev acts on the event.
func Inject(msg []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return fmt.Errorf("uevent: open a NETLINK_KOBJECT_UEVENT socket: %w", err)
	}
	defer unix.Close(fd)
	hdr := unix.NlMsghdr{
		Len:   uint32(unix.NLMSG_HDRLEN + len(msg)),
		Type:  unix.NLMSG_MIN_TYPE,
		Flags: unix.NLM_F_REQUEST,
	}
	b := make([]byte, unix.NLMSG_HDRLEN, int(hdr.Len))
	*(*unix.NlMsghdr)(unsafe.Pointer(&b[0])) = hdr
	b = append(b, msg...)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("uevent: inject an event (needs CAP_SYS_ADMIN and Linux 4.18): %w", err)
	}
	return nil
}

// Close closes the socket; a Receive blocked on it returns. Idempotent.
func (s *Socket) Close() error {
	if err := s.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("uevent: close: %w", err)
	}
	return nil
}
