package memnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newPair(t *testing.T, n *Network) (*Transport, *Transport) {
	t.Helper()
	a, err := n.NewTransport("a")
	require.NoError(t, err)
	b, err := n.NewTransport("b")
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Shutdown(); _ = b.Shutdown() })
	return a, b
}

func TestPacketsAreCopiedAndQueued(t *testing.T) {
	n := New(0)
	a, b := newPair(t, n)
	msg := []byte("ping")
	_, err := a.WriteTo(msg, b.Addr())
	require.NoError(t, err)
	msg[0] = 'X' // the sender may reuse its buffer
	p := <-b.PacketCh()
	require.Equal(t, "ping", string(p.Buf))
	require.Equal(t, a.Addr(), p.From.String())
	require.Equal(t, "memnet", p.From.Network())
	require.False(t, p.Timestamp.IsZero())
	require.Equal(t, Stats{Packets: 1, PacketBytes: 4, OpenTransports: 2}, n.Stats())
}

func TestLostPacketsAreDroppedNotBlocked(t *testing.T) {
	n := New(2)
	a, b := newPair(t, n)
	for range 5 { // queue of 2: three are dropped, none blocks
		_, err := a.WriteToAddress([]byte("x"), memberlist.Address{Addr: b.Addr(), Name: "b"})
		require.NoError(t, err)
	}
	_, err := a.WriteTo([]byte("x"), "127.1.99.99:7946") // nobody there
	require.NoError(t, err)
	require.NoError(t, b.Shutdown())
	_, err = a.WriteTo([]byte("x"), b.Addr()) // shut down
	require.NoError(t, err)
	s := n.Stats()
	require.Equal(t, uint64(2), s.Packets)
	require.Equal(t, uint64(5), s.Dropped)
	require.NoError(t, a.Shutdown())
	_, err = a.WriteTo([]byte("x"), b.Addr())
	require.Error(t, err, "a shut down transport does not send")
}

func TestStreams(t *testing.T) {
	n := New(0)
	a, b := newPair(t, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		c := <-b.StreamCh()
		defer c.Close()
		require.Equal(t, a.Addr(), c.RemoteAddr().String())
		buf := make([]byte, 5)
		_, err := io.ReadFull(c, buf)
		require.NoError(t, err)
		_, err = c.Write(append(buf, '!'))
		require.NoError(t, err)
	})
	c, err := a.DialTimeout(b.Addr(), time.Second)
	require.NoError(t, err)
	require.Equal(t, b.Addr(), c.RemoteAddr().String())
	require.Equal(t, a.Addr(), c.LocalAddr().String())
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "hello!", string(got))
	require.NoError(t, c.Close())
	wg.Wait()
	require.Equal(t, uint64(1), n.Stats().Streams)
}

func TestDialFailures(t *testing.T) {
	n := New(0)
	a, b := newPair(t, n)

	_, err := a.DialTimeout("127.1.99.99:7946", time.Second)
	require.ErrorIs(t, err, ErrRefused, "nobody listens")

	_, err = a.DialTimeout(b.Addr(), 20*time.Millisecond) // b never accepts
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())

	require.NoError(t, b.Shutdown())
	_, err = a.DialTimeout(b.Addr(), time.Second)
	require.ErrorIs(t, err, ErrRefused, "shut down")
	require.Equal(t, uint64(3), n.Stats().DialsRefused)
}

func TestDialUnblocksWhenThePeerShutsDown(t *testing.T) {
	n := New(0)
	a, b := newPair(t, n)
	errc := make(chan error, 1)
	go func() {
		_, err := a.DialTimeout(b.Addr(), 0) // no timeout: only the shutdown ends it
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the dial start waiting; the test passes either way
	require.NoError(t, b.Shutdown())
	require.ErrorIs(t, <-errc, ErrRefused)
}

func TestNamesKeepTheirAddress(t *testing.T) {
	n := New(0)
	a, err := n.NewTransport("a")
	require.NoError(t, err)
	_, err = n.NewTransport("a")
	require.ErrorIs(t, err, ErrNameInUse)
	_, err = n.NewTransport("")
	require.Error(t, err)
	addr := a.Addr()
	got, ok := n.Addr("a")
	require.True(t, ok)
	require.Equal(t, addr, got)
	ip, port, err := a.FinalAdvertiseAddr("ignored", 1)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%s:%d", ip, port), addr)

	require.NoError(t, a.Shutdown())
	require.NoError(t, a.Shutdown(), "idempotent")
	again, err := n.NewTransport("a")
	require.NoError(t, err)
	defer again.Shutdown()
	require.Equal(t, addr, again.Addr(), "a restarted node comes back at its address")
	other, err := n.NewTransport("b")
	require.NoError(t, err)
	defer other.Shutdown()
	require.NotEqual(t, addr, other.Addr())
}

func TestCutAndHeal(t *testing.T) {
	n := New(0)
	a, b := newPair(t, n)
	c, err := n.NewTransport("c")
	require.NoError(t, err)
	defer c.Shutdown()

	n.Cut("a", "b")
	_, _ = a.WriteTo([]byte("x"), b.Addr())
	_, _ = b.WriteTo([]byte("x"), a.Addr())
	_, err = a.DialTimeout(b.Addr(), time.Second)
	require.ErrorIs(t, err, ErrRefused)
	_, _ = a.WriteTo([]byte("to c"), c.Addr())
	require.Equal(t, "to c", string((<-c.PacketCh()).Buf), "other links still work")
	require.Equal(t, uint64(2), n.Stats().Dropped)

	n.Heal()
	_, _ = a.WriteTo([]byte("healed"), b.Addr())
	require.Equal(t, "healed", string((<-b.PacketCh()).Buf))
}

func TestFilterDropsChosenPackets(t *testing.T) {
	n := New(0)
	a, b := newPair(t, n)
	n.Filter(func(from, to string, p []byte) bool { return from == "a" && to == "b" && string(p) == "lose" })
	_, _ = a.WriteTo([]byte("lose"), b.Addr())
	_, _ = a.WriteTo([]byte("keep"), b.Addr())
	_, _ = b.WriteTo([]byte("lose"), a.Addr()) // the other direction
	require.Equal(t, "keep", string((<-b.PacketCh()).Buf))
	require.Equal(t, "lose", string((<-a.PacketCh()).Buf))
	require.Equal(t, uint64(1), n.Stats().Dropped)

	n.Filter(nil)
	_, _ = a.WriteTo([]byte("lose"), b.Addr())
	require.Equal(t, "lose", string((<-b.PacketCh()).Buf))
	require.Equal(t, uint64(1), n.Stats().Dropped)
}

func TestConcurrentTransports(t *testing.T) {
	n := New(0)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for k := range 50 {
				tr, err := n.NewTransport(fmt.Sprintf("t%d-%d", i, k%3))
				if errors.Is(err, ErrNameInUse) {
					continue
				}
				require.NoError(t, err)
				for j := range 8 {
					addr, _ := n.Addr(fmt.Sprintf("t%d-0", j))
					_, _ = tr.WriteTo([]byte("x"), addr)
				}
				if k%7 == 0 {
					n.Cut(fmt.Sprintf("t%d-0", i), "t0-1")
					n.Heal()
				}
				require.NoError(t, tr.Shutdown())
			}
		})
	}
	wg.Wait()
	require.Zero(t, n.Stats().OpenTransports)
}
