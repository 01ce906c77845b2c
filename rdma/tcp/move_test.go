package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// chunksOf lists the chunk numbers a Dirty bitmap marks.
func chunksOf(bitmap []byte) []int {
	var out []int
	for i := range len(bitmap) * 8 {
		if bitmap[i/8]&(1<<(i%8)) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// TestMoveSteps: Track records the chunks writes and atomics change, Dirty
// hands them over once; Seal refuses writes and atomics with ErrMoved and
// reads by anyone but the mover; Unseal serves them again; MoveAway
// answers ErrMoved to every operation with the segment's key
// (ACCESS_DENIED to another key) and never touches its memory again.
func TestMoveSteps(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		cfg.Identify = namedCreds
		s := startServer(t, cfg)
		mem, r := s.export(t, 1, 64<<10)
		require.NoError(t, s.Allow(1, []string{"mover", "app"}))
		app := dial(t, s.addr, append(opts, WithCredential([]byte("app")))...)
		mover := dial(t, s.addr, append(opts, WithCredential([]byte("mover")))...)
		ctx := t.Context()
		buf := make([]byte, 8)

		_, _, err := s.Dirty(1)
		require.ErrorIs(t, err, rdma.ErrNotTracked, "not tracked yet")
		require.Error(t, s.Track(1, 1000), "not a power of two")
		require.Error(t, s.Track(1, 2048), "below MinChunk")
		require.ErrorIs(t, s.Track(9, 4096), rdma.ErrNotExported)
		require.NoError(t, s.Track(1, 4096))

		require.NoError(t, app.Write(ctx, r, 0, []byte("hello")))
		require.NoError(t, app.Write(ctx, r, 3*4096+4090, []byte("across two")))
		_, err = app.FetchAdd64(ctx, r, 10*4096, 1)
		require.NoError(t, err)
		require.NoError(t, app.Read(ctx, r, 15*4096, buf)) // reads change nothing
		bm, n, err := s.Dirty(1)
		require.NoError(t, err)
		require.Len(t, bm, 2, "16 chunks")
		require.Equal(t, []int{0, 3, 4, 10}, chunksOf(bm))
		require.Equal(t, 4, n)
		bm, n, err = s.Dirty(1)
		require.NoError(t, err)
		require.Zero(t, n, "Dirty clears what it answered: %v", chunksOf(bm))

		require.NoError(t, s.Seal(1, "mover"))
		require.ErrorIs(t, app.Write(ctx, r, 0, []byte("late")), rdma.ErrMoved)
		_, _, err = app.CompareAndSwap64(ctx, r, 8, 0, 1)
		require.ErrorIs(t, err, rdma.ErrMoved)
		_, err = app.FetchAdd64(ctx, r, 16, 1)
		require.ErrorIs(t, err, rdma.ErrMoved)
		require.ErrorIs(t, app.Read(ctx, r, 0, buf), rdma.ErrMoved, "a reader other than the mover could miss writes at the new home")
		require.ErrorIs(t, mover.Write(ctx, r, 0, []byte("late")), rdma.ErrMoved, "the mover only reads")
		require.NoError(t, mover.Read(ctx, r, 0, buf))
		require.Equal(t, "hello", string(buf[:5]))
		_, n, err = s.Dirty(1)
		require.NoError(t, err)
		require.Zero(t, n, "refused operations change nothing")
		require.NoError(t, s.Seal(1, "mover"), "sealing again only waits")

		require.NoError(t, s.Unseal(1))
		require.NoError(t, app.Write(ctx, r, 0, []byte("again")))
		_, _, err = s.Dirty(1)
		require.Error(t, err, "Unseal stops tracking")

		require.NoError(t, s.Seal(1, "mover"))
		require.NoError(t, s.MoveAway(1))
		copy(mem, bytes.Repeat([]byte{0xEE}, len(mem))) // the memory is the source's again
		require.ErrorIs(t, app.Read(ctx, r, 0, buf), rdma.ErrMoved)
		require.ErrorIs(t, mover.Read(ctx, r, 0, buf), rdma.ErrMoved)
		require.ErrorIs(t, app.Write(ctx, r, 0, buf), rdma.ErrMoved)
		wrong := r
		wrong.Key[0] ^= 1
		require.ErrorIs(t, app.Read(ctx, wrong, 0, buf), rdma.ErrAccessDenied)
		require.ErrorIs(t, s.MoveAway(1), rdma.ErrNotExported)
		require.ErrorIs(t, s.Seal(1, "mover"), rdma.ErrNotExported)
		require.ErrorIs(t, s.Unseal(1), rdma.ErrNotExported)
		require.Equal(t, bytes.Repeat([]byte{0xEE}, len(mem)), mem)
	})
}

// TestHandoverToken: a sealed segment's MOVED answers carry no token
// until Handover, then the token (rdma.MovedError, which matches
// ErrMoved) to writes, atomics and reads alike; Unseal and a new Seal
// clear it, and Handover refuses a segment that is not sealed.
func TestHandoverToken(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		s := startServer(t, cfg)
		_, r := s.export(t, 1, 64<<10)
		app := dial(t, s.addr, opts...)
		ctx := t.Context()
		buf := make([]byte, 8)
		token := func(err error) uint64 {
			t.Helper()
			require.ErrorIs(t, err, rdma.ErrMoved)
			var me *rdma.MovedError
			if errors.As(err, &me) {
				return me.Token
			}
			return 0
		}
		require.ErrorIs(t, s.Handover(1, 7), errs.ErrInvalid, "not sealed")
		require.ErrorIs(t, s.Handover(9, 7), rdma.ErrNotExported)
		require.NoError(t, s.Seal(1, "mover"))
		require.Zero(t, token(app.Write(ctx, r, 0, buf)), "sealed, the last push not done")
		require.NoError(t, s.Handover(1, 0xfeed))
		require.EqualValues(t, 0xfeed, token(app.Write(ctx, r, 0, buf)))
		_, err := app.FetchAdd64(ctx, r, 8, 1)
		require.EqualValues(t, 0xfeed, token(err))
		require.EqualValues(t, 0xfeed, token(app.Read(ctx, r, 0, buf)))
		require.NoError(t, s.Seal(1, "mover"))
		require.Zero(t, token(app.Write(ctx, r, 0, buf)), "a new seal clears the token")
		require.NoError(t, s.Handover(1, 0xfeed))
		require.NoError(t, s.Unseal(1))
		require.NoError(t, app.Write(ctx, r, 0, buf))
		require.NoError(t, s.Seal(1, "mover"))
		require.Zero(t, token(app.Write(ctx, r, 0, buf)), "Unseal cleared the token")
	})
}

// TestSealWaitsOutWrites: while writers and atomics hammer a segment, the
// memory Seal leaves is final: after Seal returns nothing changes it, every
// operation acknowledged before is in it (each acknowledged FADD counted
// once, each writer's last acknowledged write in place), and every
// refused one answered ErrMoved.
func TestSealWaitsOutWrites(t *testing.T) {
	const writers = 4
	s := startServer(t, ServerConfig{})
	const size = 256 << 10
	mem, r := s.export(t, 1, size)
	require.NoError(t, s.Track(1, 4096))
	ctx := t.Context()
	var (
		wg    sync.WaitGroup
		added atomic.Int64
		stop  atomic.Bool
		last  [writers]atomic.Uint64
	)
	fail := make(chan error, writers)
	for w := range writers {
		c := dial(t, s.addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 8192)
			for i := uint64(1); !stop.Load(); i++ {
				var err error
				if i%2 == 0 {
					_, err = c.FetchAdd64(ctx, r, 0, 1)
					if err == nil {
						added.Add(1)
					}
				} else {
					binary.LittleEndian.PutUint64(buf, i)
					if err = c.Write(ctx, r, int64(8192*(1+w)), buf); err == nil {
						last[w].Store(i)
					}
				}
				if err != nil {
					if !errors.Is(err, rdma.ErrMoved) {
						fail <- err
					}
					return
				}
			}
		}()
	}
	for added.Load() < 200 { // rounds of a copy meanwhile
		_, _, err := s.Dirty(1)
		require.NoError(t, err)
	}
	require.NoError(t, s.Seal(1, ""))
	snapshot := bytes.Clone(mem)
	_, _, err := s.Dirty(1)
	require.NoError(t, err)
	stop.Store(true)
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatalf("an operation failed with other than ErrMoved: %v", err)
	}
	require.Equal(t, snapshot, mem, "nothing changed the memory after Seal returned")
	require.Equal(t, uint64(added.Load()), binary.LittleEndian.Uint64(mem), "every acknowledged FADD is in the sealed memory, once")
	for w := range writers {
		require.Equal(t, last[w].Load(), binary.LittleEndian.Uint64(mem[8192*(1+w):]), "writer %d's last acknowledged write", w)
	}
}

// TestReadLocal: the source of a move reads its segment in process, sealed
// or not, as the memory holds it; Chunk says what Track was given. Out of
// range, unknown and withdrawn segments are refused with typed errors.
func TestReadLocal(t *testing.T) {
	s := startServer(t, DefaultConfig())
	_, r := s.export(t, 1, 64<<10)
	c := dial(t, s.addr)
	ctx := t.Context()
	require.NoError(t, c.Write(ctx, r, 4096, []byte("local")))

	_, err := s.Chunk(1)
	require.ErrorIs(t, err, rdma.ErrNotTracked, "not tracked yet")
	require.NoError(t, s.Track(1, 8192))
	chunk, err := s.Chunk(1)
	require.NoError(t, err)
	require.EqualValues(t, 8192, chunk)

	got := make([]byte, 5)
	require.NoError(t, s.ReadLocal(1, 4096, got))
	require.Equal(t, "local", string(got))
	require.NoError(t, s.Seal(1, "nobody"))
	got = make([]byte, 5)
	require.NoError(t, s.ReadLocal(1, 4096, got), "a sealed segment is read here all the same")
	require.Equal(t, "local", string(got))

	require.ErrorIs(t, s.ReadLocal(1, 64<<10-2, got), rdma.ErrOutOfRange)
	require.ErrorIs(t, s.ReadLocal(1, -1, got), rdma.ErrOutOfRange)
	require.ErrorIs(t, s.ReadLocal(9, 0, got), rdma.ErrNotExported)
	require.NoError(t, s.MoveAway(1))
	require.ErrorIs(t, s.ReadLocal(1, 0, got), rdma.ErrNotExported, "withdrawn")
}
