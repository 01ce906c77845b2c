package coherence

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/coherence/lincheck"
)

// errPartitioned is what a partitioned memLink returns.
var errPartitioned = errors.New("test: link partitioned")

// memLink connects a Sharer to a Home in memory; it can be partitioned and
// pointed at a new Home (a restart).
type memLink struct {
	mu   sync.Mutex
	home *Home
	down atomic.Bool
}

func (l *memLink) h() *Home {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.home
}

func (l *memLink) Call(ctx context.Context, m Message) (Message, error) {
	if l.down.Load() {
		time.Sleep(time.Millisecond)
		return Message{}, errPartitioned
	}
	m.Data = append([]byte(nil), m.Data...)
	h := l.h()
	return h.HandleHeld(ctx, m, h.Config().Lease/20), nil // as poold serves it
}

func (l *memLink) Poll(ctx context.Context, id SharerID, wait time.Duration, acks []Message) ([]Message, error) {
	if l.down.Load() {
		time.Sleep(5 * time.Millisecond)
		return nil, errPartitioned
	}
	for i := range acks {
		acks[i].Data = append([]byte(nil), acks[i].Data...)
	}
	return l.h().Poll(ctx, id, wait, acks), nil
}

// cluster is a home and its sharers in one process.
type cluster struct {
	t     *testing.T
	cfg   Config
	mem   []byte
	mu    sync.Mutex
	home  *Home
	links []*memLink
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newCluster(t *testing.T, cfg Config, size int) *cluster {
	c := &cluster{t: t, cfg: cfg, mem: make([]byte, size), stop: make(chan struct{})}
	var err error
	c.home, err = NewHome(cfg, c.mem, nil)
	require.NoError(t, err)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		tk := time.NewTicker(cfg.Lease / 20)
		defer tk.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tk.C:
				c.mu.Lock()
				h := c.home
				c.mu.Unlock()
				h.Tick()
				require.NoError(t, h.Check())
			}
		}
	}()
	t.Cleanup(func() {
		close(c.stop)
		c.wg.Wait()
		c.home.Close()
	})
	return c
}

func (c *cluster) attach() (*Sharer, *memLink) {
	c.mu.Lock()
	l := &memLink{home: c.home}
	c.links = append(c.links, l)
	c.mu.Unlock()
	s, err := NewSharer(c.cfg, int64(len(c.mem)), l, nil)
	require.NoError(c.t, err)
	return s, l
}

// restart replaces the home by a new incarnation over the same memory,
// which refuses grants for one lease.
func (c *cluster) restart() {
	cfg := c.cfg
	cfg.Grace = cfg.Lease
	h, err := NewHome(cfg, c.mem, nil)
	require.NoError(c.t, err)
	c.mu.Lock()
	old := c.home
	c.home = h
	for _, l := range c.links {
		l.mu.Lock()
		l.home = h
		l.mu.Unlock()
	}
	c.mu.Unlock()
	old.Close()
}

// worker runs random operations on the hot words until stop closes.
func worker(ctx context.Context, s *Sharer, rec *lincheck.Recorder, client int, keys int, pageSize int, seed uint64, stop <-chan struct{}, errs chan<- error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for {
		select {
		case <-stop:
			return
		default:
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Microsecond) // keeps the history small enough to check
		k := rng.IntN(keys)
		off := int64(k * pageSize)
		in := lincheck.Input{Key: k}
		call := rec.Now()
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var out lincheck.Output
		var err error
		switch r := rng.IntN(10); {
		case r < 5:
			in.Kind = lincheck.Read
			out.Value, err = s.Load64(octx, off)
		case r < 8:
			in.Kind, in.Value = lincheck.Write, rng.Uint64N(1000)+1
			var b [8]byte
			le.PutUint64(b[:], in.Value)
			_, err = s.WriteAt(octx, b[:], off)
		default:
			in.Kind = lincheck.CAS
			cur, lerr := s.Load64(octx, off)
			if lerr != nil {
				err = lerr
				break
			}
			call = rec.Now()
			in.Old, in.New = cur, rng.Uint64N(1000)+1
			out.Swapped, err = s.CompareAndSwap64(octx, off, in.Old, in.New)
		}
		cancel()
		switch {
		case err == nil:
			rec.Add(client, in, out, call)
		case errors.Is(err, ErrClosed), errors.Is(err, ErrSegmentLost):
			rec.AddUnknown(client, in, call)
			if errs != nil {
				select {
				case errs <- err:
				default:
				}
			}
			return
		default:
			rec.AddUnknown(client, in, call)
		}
	}
}

func keepDir(t *testing.T) string {
	if d := os.Getenv("FARMEM_KEEP_HISTORIES"); d != "" {
		return d
	}
	return t.TempDir()
}

func TestLinearizableInProcess(t *testing.T) {
	cases := []struct {
		name  string
		fault string
	}{
		{"no faults", ""},
		{"sharer killed", "kill"},
		{"sharer partitioned and healed", "partition"},
		{"home restarted", "restart"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{PageSize: 512, Lease: 100 * time.Millisecond}
			const keys, clients = 3, 3
			c := newCluster(t, cfg, keys*cfg.PageSize)
			rec := lincheck.NewRecorder()
			ctx := t.Context()
			var sharers []*Sharer
			var links []*memLink
			for range clients {
				s, l := c.attach()
				sharers = append(sharers, s)
				links = append(links, l)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			lost := make(chan error, clients)
			start := func(i int, s *Sharer) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker(ctx, s, rec, i, keys, cfg.PageSize, uint64(i+1)*7919, stop, lost)
				}()
			}
			for i, s := range sharers {
				start(i, s)
			}
			time.Sleep(300 * time.Millisecond)
			switch tc.fault {
			case "kill":
				// Sharer 2 dies: the writes it had not written back are lost.
				sharers[2].Abandon()
			case "partition":
				from := rec.Now()
				links[1].down.Store(true)
				time.Sleep(2 * cfg.Lease)
				links[1].down.Store(false)
				// What sharer 1 wrote and did not write back before its
				// lease ran out is lost; its reads of it are not evidence.
				rec.Forget(1, from-2*int64(cfg.Lease), rec.Now()+2*int64(cfg.Lease))
			case "restart":
				before := rec.Now()
				c.restart()
				// Every attachment fails with ErrSegmentLost; unsynced writes
				// are gone. Re-attach and go on.
				for range clients {
					select {
					case err := <-lost:
						require.ErrorIs(t, err, ErrSegmentLost)
					case <-time.After(5 * time.Second):
						t.Fatal("an attachment did not fail with ErrSegmentLost after the home restarted")
					}
				}
				for i := range clients {
					rec.Forget(i, before-int64(cfg.Lease), rec.Now())
				}
				for i := range clients {
					sharers[i].Abandon()
					s, _ := c.attach()
					sharers[i] = s
					start(i+clients, s)
				}
			}
			time.Sleep(400 * time.Millisecond)
			close(stop)
			wg.Wait()
			if tc.fault == "kill" {
				rec.Forget(2, 0, rec.Now()) // its worker has stopped by now
			}
			for i, s := range sharers {
				if tc.fault == "kill" && i == 2 {
					continue
				}
				err := s.Close(ctx)
				if tc.fault == "partition" && i == 1 {
					// The partitioned sharer may report the writes it lost.
					if err != nil {
						require.ErrorIs(t, err, ErrLeaseExpired)
					}
					continue
				}
				require.NoError(t, err)
			}
			ops := rec.Ops()
			require.NotEmpty(t, ops)
			ok, path, err := lincheck.Check(ops, 30*time.Second, keepDir(t))
			require.NoError(t, err)
			require.True(t, ok, "history of %d operations is not linearizable; see %s", len(ops), path)
			t.Logf("%d operations linearizable; home stats %+v", len(ops), c.home.Stats())
		})
	}
}
