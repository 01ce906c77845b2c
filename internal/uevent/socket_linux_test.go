package uevent

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// inNewNetns runs fn on a thread moved into a network namespace of its
// own, which dies with the thread; sockets fn opens stay in that namespace.
// Synthetic events sent there reach no udev and no other listener.
func inNewNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a network namespace of the test's own, and CAP_SYS_ADMIN to inject an event")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		fn()
		errc <- nil
	}()
	require.NoError(t, <-errc)
}

// TestSocketReceivesInjected opens the real NETLINK_KOBJECT_UEVENT socket
// and receives an event the kernel broadcast on the test's behalf: the
// path a real device's event takes to poold, without a device.
func TestSocketReceivesInjected(t *testing.T) {
	var s *Socket
	var injectErr error
	inNewNetns(t, func() {
		var err error
		if s, err = Listen(); err != nil {
			injectErr = err
			return
		}
		injectErr = Inject(Event{Action: "add", DevPath: "/devices/platform/farmem-test/dax9.0", Subsystem: "dax", Env: map[string]string{"DEVNAME": "dax9.0"}}.Bytes())
	})
	if s != nil {
		defer s.Close()
	}
	if errors.Is(injectErr, unix.EINVAL) || errors.Is(injectErr, unix.EOPNOTSUPP) || errors.Is(injectErr, unix.ECONNREFUSED) {
		t.Skipf("this kernel does not take injected uevents (Linux 4.18 or later does): %v", injectErr)
	}
	require.NoError(t, injectErr)
	buf := make([]byte, MaxMessage)
	got := make(chan error, 1)
	var ev Event
	go func() {
		n, err := s.Receive(buf)
		if err == nil {
			ev, err = Parse(buf[:n])
		}
		got <- err
	}()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		s.Close()
		<-got
		t.Fatal("no event within 10s of injecting it")
	}
	require.Equal(t, "add", ev.Action)
	require.Equal(t, "dax", ev.Subsystem)
	require.Equal(t, "dax9.0", ev.Env["DEVNAME"])
	require.NotZero(t, ev.Seqnum, "the kernel numbers what it broadcasts")
}

// TestSocketCloseWakesReceive: Close from another goroutine ends a blocked
// Receive with os.ErrClosed.
func TestSocketCloseWakesReceive(t *testing.T) {
	s, err := Listen()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Receive(make([]byte, MaxMessage)); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, s.Close())
	require.ErrorIs(t, <-done, os.ErrClosed)
	require.NoError(t, s.Close(), "Close is idempotent")
}
