package coherence

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// manualClock is a Clock the test moves by hand.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// renewWatch is a memLink that signals each WriteBack it is asked to carry.
type renewWatch struct {
	*memLink
	wb chan struct{}
}

func (l renewWatch) Call(ctx context.Context, m Message) (Message, error) {
	if m.Kind == WriteBack {
		select {
		case l.wb <- struct{}{}:
		default:
		}
	}
	return l.memLink.Call(ctx, m)
}

// TestPartitionedSharerServesNoExpiredCopy: a sharer cut off from its home
// while it holds one page shared and owns another. The renewal of the owned
// page cannot get through; meanwhile the shared page's lease runs out and
// another sharer writes it. The cut-off sharer must not serve its expired
// copy from the fast path, neither during the partition nor once it heals.
func TestPartitionedSharerServesNoExpiredCopy(t *testing.T) {
	cfg := Config{PageSize: 512, Lease: 160 * time.Millisecond} // the keeper ticks every 10 ms
	clk := &manualClock{t: time.Unix(1000, 0)}
	home, err := NewHome(cfg, make([]byte, 2*cfg.PageSize), clk)
	require.NoError(t, err)
	defer home.Close()
	la := renewWatch{memLink: &memLink{home: home}, wb: make(chan struct{}, 1)}
	a, err := NewSharer(cfg, int64(2*cfg.PageSize), la, clk)
	require.NoError(t, err)
	b, err := NewSharer(cfg, int64(2*cfg.PageSize), &memLink{home: home}, clk)
	require.NoError(t, err)
	ctx := t.Context()
	word := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

	// a holds page 0 shared and page 1 modified, both until t0+lease.
	v, err := a.Load64(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, v)
	_, err = a.WriteAt(ctx, word(7), int64(cfg.PageSize))
	require.NoError(t, err)

	la.down.Store(true)
	// Past the half lease the keeper renews page 1; the home does not answer.
	clk.add(cfg.Lease * 6 / 10)
	select {
	case <-la.wb:
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper sent no renewal of the owned page past its half lease")
	}
	// Past the lease: the home gives page 0 to b, which writes it.
	clk.add(cfg.Lease*4/10 + time.Millisecond)
	_, err = b.WriteAt(ctx, word(5), 0)
	require.NoError(t, err)
	// The keeper's next tick ends the fast path of a's expired copy (a
	// stuck renewal must not hold it up; give it far more than a tick).
	for deadline := time.Now().Add(5 * time.Second); fastLevel(a.fast[0].Load()) != fastNone && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	v, err = a.Load64(short, 0)
	cancel()
	require.Error(t, err, "read %d from the copy whose lease ran out while cut off from the home", v)
	require.ErrorIs(t, err, ErrUnavailable)
	require.NotContains(t, err.Error(), "is poold running", "the home is cut off, not the local poold")

	require.EqualValues(t, 5, healAndRead(t, clk, cfg, &la.down, a), "once the partition healed, the sharer read its expired copy, not b's write")

	require.NoError(t, b.Close(ctx))
	if err := a.Close(ctx); err != nil {
		require.ErrorIs(t, err, ErrLeaseExpired, "only the write to page 1 may be reported lost")
	}
}

// TestFastPathAfterStall: a sharer whose keeper has not ticked since its
// copy's lease ran out (the process stood still: here the lease is an hour,
// so the keeper ticks every 225 s of real time, and the clock is moved by
// hand) must not serve that copy from the fast path, which reads the clock
// against the copy's deadline itself.
func TestFastPathAfterStall(t *testing.T) {
	cfg := Config{PageSize: 512, Lease: time.Hour}
	clk := &manualClock{t: time.Unix(1000, 0)}
	home, err := NewHome(cfg, make([]byte, cfg.PageSize), clk)
	require.NoError(t, err)
	defer home.Close()
	la := &memLink{home: home}
	a, err := NewSharer(cfg, int64(cfg.PageSize), la, clk)
	require.NoError(t, err)
	b, err := NewSharer(cfg, int64(cfg.PageSize), &memLink{home: home}, clk)
	require.NoError(t, err)
	ctx := t.Context()

	v, err := a.Load64(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, v)
	require.Equal(t, fastRead, fastLevel(a.fast[0].Load()), "a holds the page shared, on the fast path")

	la.down.Store(true) // a hears no invalidation: the home waits out its lease
	clk.add(cfg.Lease + time.Millisecond)
	_, err = b.WriteAt(ctx, binary.LittleEndian.AppendUint64(nil, 5), 0)
	require.NoError(t, err)
	require.Equal(t, fastRead, fastLevel(a.fast[0].Load()), "the keeper has not ticked since")

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	v, err = a.Load64(short, 0)
	cancel()
	require.Error(t, err, "read %d from the copy whose lease ran out", v)
	require.ErrorIs(t, err, ErrUnavailable)

	require.EqualValues(t, 5, healAndRead(t, clk, cfg, &la.down, a))
	require.NoError(t, b.Close(ctx))
	require.NoError(t, a.Close(ctx))
}

// healAndRead heals a link cut off (down), moves the clock to when the
// request a sent meanwhile is due to be sent again, and returns the word a
// reads at 0.
func healAndRead(t *testing.T, clk *manualClock, cfg Config, down *atomic.Bool, a *Sharer) uint64 {
	down.Store(false)
	clk.add(cfg.Lease / 8)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	v, err := a.Load64(ctx, 0)
	require.NoError(t, err)
	return v
}
