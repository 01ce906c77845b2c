package alloc_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/faultproxy"
)

// pattern is n bytes whose every 8-byte word holds its own offset plus
// salt, so a read shows where its bytes came from.
func pattern(n int, salt uint64) []byte { return patternAt(0, n, salt) }

// patternAt is the n bytes at off of a pattern.
func patternAt(off int64, n int, salt uint64) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(off)+uint64(i)+salt)
	}
	return b
}

// rdmaSegment allocates an rdma segment of n bytes on c holding
// pattern(n, salt), freed when t ends.
func rdmaSegment(t *testing.T, c *alloc.Client, n int, salt uint64, opts ...alloc.AllocOption) (*alloc.Segment, []byte) {
	t.Helper()
	seg, err := c.Alloc(t.Context(), int64(n), append([]alloc.AllocOption{alloc.WithTier(alloc.TierRDMA)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { seg.Free(t.Context()) })
	want := pattern(n, salt)
	_, err = seg.WriteAt(want, 0)
	require.NoError(t, err)
	return seg, want
}

// scan reads [from, to) in 4 KiB ReadAt calls and checks each against want.
func scan(t *testing.T, seg *alloc.Segment, want []byte, from, to int) {
	t.Helper()
	p := make([]byte, 4096)
	for off := from; off < to; off += len(p) {
		_, err := seg.ReadAt(p, int64(off))
		require.NoError(t, err)
		require.True(t, bytes.Equal(want[off:off+len(p)], p), "bytes at %d", off)
	}
}

// TestReadAheadStream: a sequential scan of a segment the client holds
// alone is detected, its window grows while the stream uses it, the reads
// are served from what was read ahead with the right bytes, and a random
// access ends the stream and starts no more read-ahead.
func TestReadAheadStream(t *testing.T) {
	_, c := startPool(t)
	const n = 8 << 20
	seg, want := rdmaSegment(t, c, n, 1)
	require.Zero(t, alloc.ReadAheadWindow(seg))

	scan(t, seg, want, 0, 32<<10)
	first := alloc.ReadAheadWindow(seg)
	require.Positive(t, first, "a sequential scan starts a stream")
	scan(t, seg, want, 32<<10, 6<<20)
	require.Greater(t, alloc.ReadAheadWindow(seg), first, "the window grows while the stream uses it")
	st := c.Stats()
	require.EqualValues(t, 1, st.PrefetchStreams)
	require.Greater(t, st.PrefetchHits, 9*st.PrefetchMisses, "most of the scan is served from read-ahead: %+v", st)
	require.Equal(t, st.PrefetchHits*4096, st.PrefetchHitBytes)

	p := make([]byte, 4096)
	for _, off := range []int64{100 << 10, 7 << 20, 3 << 20, 5<<20 + 8192} {
		_, err := seg.ReadAt(p, off)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want[off:off+4096], p), "bytes at %d", off)
	}
	require.Zero(t, alloc.ReadAheadWindow(seg), "random access ends the stream")
	require.Equal(t, st.PrefetchedBytes, c.Stats().PrefetchedBytes, "and reads nothing more ahead")

	// Reads larger than a piece of read-ahead (1 MiB) stream by themselves.
	big := make([]byte, 2<<20)
	for off := int64(0); off < n; off += int64(len(big)) {
		_, err := seg.ReadAt(big, off)
		require.NoError(t, err)
		require.True(t, bytes.Equal(want[off:off+int64(len(big))], big), "bytes at %d", off)
	}
	require.Equal(t, st.PrefetchedBytes, c.Stats().PrefetchedBytes, "a scan in 2 MiB reads is not read ahead")
}

// TestReadAheadStride: a strided walk (4 KiB every 64 KiB, forward and
// backward) is read ahead access by access, with the right bytes.
func TestReadAheadStride(t *testing.T) {
	_, c := startPool(t)
	const n = 4 << 20
	seg, want := rdmaSegment(t, c, n, 2)
	p := make([]byte, 4096)
	for _, offs := range [][2]int64{{0, 64 << 10}, {n - 4096, -64 << 10}} {
		before := c.Stats()
		for off := offs[0]; off >= 0 && off+4096 <= n; off += offs[1] {
			_, err := seg.ReadAt(p, off)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want[off:off+4096], p), "bytes at %d", off)
		}
		after := c.Stats()
		require.Equal(t, before.PrefetchStreams+1, after.PrefetchStreams)
		require.Greater(t, after.PrefetchHits-before.PrefetchHits, int64(40), "of 64 strided reads: %+v", after)
		// Only the strided bytes are fetched, not the gaps between them.
		require.LessOrEqual(t, after.PrefetchedBytes-before.PrefetchedBytes, int64(64*4096))
	}
}

// TestReadAheadOwnWrites: the client's own writes and atomics on bytes it
// has read ahead drop them, so the next read sees what was written.
func TestReadAheadOwnWrites(t *testing.T) {
	_, c := startPool(t)
	const n = 8 << 20
	seg, want := rdmaSegment(t, c, n, 3)
	scan(t, seg, want, 0, 2<<20) // the window now reaches well past 2 MiB
	require.NoError(t, seg.Prefetch(6<<20, 1<<20))
	wasted := c.Stats().PrefetchWastedBytes

	fresh := pattern(4096, 1<<40)
	_, err := seg.WriteAt(fresh, 2<<20+8192)
	require.NoError(t, err)
	copy(want[2<<20+8192:], fresh)
	_, err = seg.Add64(2<<20+65536, 5)
	require.NoError(t, err)
	binary.LittleEndian.PutUint64(want[2<<20+65536:], binary.LittleEndian.Uint64(want[2<<20+65536:])+5)
	require.NoError(t, seg.Store64(6<<20+16, 77))
	binary.LittleEndian.PutUint64(want[6<<20+16:], 77)
	batch := pattern(8192, 1<<41)
	require.NoError(t, seg.WriteBatch(t.Context(), []alloc.Span{{Off: 6<<20 + 65536, Buf: batch}}))
	copy(want[6<<20+65536:], batch)
	require.Greater(t, c.Stats().PrefetchWastedBytes, wasted, "the overwritten pieces were dropped")

	scan(t, seg, want, 2<<20, 3<<20)
	scan(t, seg, want, 6<<20, 7<<20)
}

// TestReadAheadOnlyWhenHeldAlone: read-ahead is off for segments another
// client can reach — named ones (also for their creator), attached ones,
// reopened ones, shared attachments — and with WithReadAhead(false):
// their scans fetch nothing ahead and Prefetch does nothing on them.
func TestReadAheadOnlyWhenHeldAlone(t *testing.T) {
	cfg, c := startPool(t)
	other := dial(t, cfg.Socket)
	off := dial(t, cfg.Socket, alloc.WithReadAhead(false))
	const n = 1 << 20
	named, want := rdmaSegment(t, c, n, 4, alloc.WithName("ra-named"))
	attached, err := other.Attach(t.Context(), "ra-named")
	require.NoError(t, err)
	shared, err := other.Attach(t.Context(), "ra-named", alloc.Shared())
	require.NoError(t, err)
	mine, _ := rdmaSegment(t, c, n, 4)
	reopened, err := c.Open(t.Context(), mine.ID())
	require.NoError(t, err)
	unwanted, _ := rdmaSegment(t, off, n, 4)
	for name, seg := range map[string]*alloc.Segment{"named": named, "attached": attached, "reopened": reopened, "read-ahead off": unwanted} {
		require.Equal(t, int64(-1), alloc.ReadAheadWindow(seg), name)
		require.NoError(t, seg.Prefetch(0, n), name)
		scan(t, seg, want, 0, n)
	}
	require.Equal(t, int64(-1), alloc.ReadAheadWindow(shared))
	require.NoError(t, shared.Prefetch(0, 4096))
	for _, cl := range []*alloc.Client{c, other, off} {
		st := cl.Stats()
		st.DataConnects = 0 // the reads' own connections
		require.Equal(t, alloc.ClientStats{}, st)
	}
	require.Positive(t, alloc.ReadAheadWindow(mine)+1, "the segment c allocated without a name reads ahead")
}

// TestPrefetchBadInput: every tier refuses a range outside the segment,
// negative offsets and lengths of zero or less, as ReadAt does, with a
// typed error; a closed segment returns ErrClosed.
func TestPrefetchBadInput(t *testing.T) {
	_, c := startPool(t)
	for _, tier := range []alloc.Tier{alloc.TierRDMA, alloc.TierCXL, alloc.TierLocal} {
		seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(tier))
		require.NoError(t, err)
		for _, tc := range []struct {
			off, n int64
			want   error
		}{
			{-1, 10, alloc.ErrOutOfRange},
			{1 << 20, 1, alloc.ErrOutOfRange},
			{1<<20 - 10, 11, alloc.ErrOutOfRange},
			{1 << 30, 1 << 62, alloc.ErrOutOfRange},
			{0, 0, alloc.ErrInvalid},
			{0, -5, alloc.ErrInvalid},
		} {
			err := seg.Prefetch(tc.off, tc.n)
			require.ErrorIs(t, err, tc.want, "%s: Prefetch(%d, %d)", tier, tc.off, tc.n)
		}
		require.NoError(t, seg.Prefetch(0, 1<<20), tier.String())
		require.NoError(t, seg.Prefetch(1<<20-1, 1), tier.String())
		require.NoError(t, seg.Free(t.Context()))
		require.ErrorIs(t, seg.Prefetch(0, 1), alloc.ErrClosed)
	}
}

// TestReadAheadConcurrent: a reader scanning and one reading at random,
// while a writer of the same client rewrites chunks until both are done,
// never read a version of a chunk older than the last write that returned
// before the read began, and the race detector finds nothing. The
// detector follows one stream per segment, and the random reader's calls
// break the scan's pattern whenever they come in between, so the scanner
// reads ahead with Prefetch, 64 KiB at a time one block ahead of itself,
// as Segment.Prefetch advises goroutines that share a segment: pieces are
// held, in flight and dropped by the writes throughout the run.
func TestReadAheadConcurrent(t *testing.T) {
	_, c := startPool(t)
	const n, chunk, block = 4 << 20, 4096, 64 << 10
	seg, _ := rdmaSegment(t, c, n, 0)
	// version[i] counts the writes to chunk i that returned, read under
	// mu. A chunk is written with its count in byte 4 of each word (the
	// salt count<<32): one byte, which a read that races the write cannot
	// tear into a value that is neither.
	var mu sync.Mutex
	version := make([]uint64, n/chunk)
	seen := func(off int64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		return version[off/chunk]
	}
	before := c.Stats().PrefetchHits
	// The readers start once the first write returned, and the writer
	// writes until they are done.
	started, done := make(chan struct{}), make(chan struct{})
	var readers, wg sync.WaitGroup
	for g := range 2 {
		readers.Go(func() {
			<-started
			p := make([]byte, chunk)
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 1200 {
				off := int64(i%(n/chunk)) * chunk
				if g == 1 {
					off = int64(rng.IntN(n/chunk)) * chunk
				} else if off%block == 0 {
					if err := seg.Prefetch((off+block)%n, block); err != nil {
						t.Error(err)
						return
					}
				}
				// The last write that returned before the read began; a
				// newer one may land while it runs, an older one may not.
				v := seen(off)
				if _, err := seg.ReadAt(p, off); err != nil {
					t.Error(err)
					return
				}
				if got := (binary.LittleEndian.Uint64(p) - uint64(off)) >> 32; got < v {
					t.Errorf("reader %d at %d: read version %d, older than %d, written before the read began", g, off, got, v)
					return
				}
			}
		})
	}
	start := sync.OnceFunc(func() { close(started) })
	wg.Go(func() {
		defer start() // also when the writer fails
		rng := rand.New(rand.NewPCG(9, 9))
		for w := 0; ; w++ {
			if w == 1 {
				start()
			}
			select {
			case <-done:
				return
			default:
			}
			i := rng.IntN(n / chunk)
			v := seen(int64(i*chunk)) + 1
			if v > 0xff {
				t.Errorf("chunk %d: write %d does not fit its byte", i, v)
				return
			}
			if _, err := seg.WriteAt(patternAt(int64(i*chunk), chunk, v<<32), int64(i*chunk)); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			version[i] = v
			mu.Unlock()
		}
	})
	readers.Wait()
	close(done)
	wg.Wait()
	require.Greater(t, c.Stats().PrefetchHits, before, "reads were served from what was read ahead")
}

// TestReadAheadWriteDropsPieceOnItsWay: a piece whose background read
// fetched the home's bytes before a write of this client landed there,
// and that completes only after the write returned, is never served: the
// write drops the pieces it touches after it ran as well as before. A
// proxy holds the write's reply once the home applied it; meanwhile such
// a piece, holding the bytes from before the write, is put on its way;
// the write then returns, the piece's read completes, and a read of the
// bytes returns the write's.
func TestReadAheadWriteDropsPieceOnItsWay(t *testing.T) {
	cfg, _ := startPool(t)
	// While hold is set, the proxy signals held at the first reply to a
	// request sent meanwhile and delivers it once release is closed.
	var hold, sent atomic.Bool
	held, release := make(chan struct{}, 1), make(chan struct{})
	through, _ := lazyProxy(t, faultproxy.Config{Record: func(fromClient bool, _ []byte) {
		switch {
		case !hold.Load():
		case fromClient:
			sent.Store(true)
		case sent.Load():
			select {
			case held <- struct{}{}:
			default:
			}
			<-release
		}
	}})
	c := dial(t, cfg.Socket, alloc.WithDataAddr(through))
	before, after := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	t.Cleanup(func() { seg.Free(t.Context()) })
	_, err = seg.WriteAt(before, 0)
	require.NoError(t, err)

	hold.Store(true)
	wrote := make(chan error, 1)
	go func() {
		_, err := seg.WriteAt(after, 0)
		wrote <- err
	}()
	<-held // the home applied the write; its reply waits at the proxy
	complete, ok := alloc.HoldPiece(seg, 0, bytes.Clone(before))
	require.True(t, ok, "a segment this client holds alone reads ahead")
	hold.Store(false)
	close(release)
	require.NoError(t, <-wrote)
	complete() // the piece's read completes after the write returned

	p := make([]byte, len(after))
	_, err = seg.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, after, p, "a read after the write returns the write's bytes")
}

// TestReadAheadHomeFails: when the home stops answering in the middle of a
// read-ahead stream, ReadAt fails with ErrUnavailable within the operation
// timeout (never a hang, never bytes it did not read); when the home
// answers again, the pieces whose reads failed are read again and the scan
// returns the right bytes. Closing the segment then drops what is held.
func TestReadAheadHomeFails(t *testing.T) {
	cfg, _ := startPool(t)
	var dead atomic.Bool
	through, proxy := lazyProxy(t, faultproxy.Config{ReplyBudget: func() int {
		if dead.Load() {
			return 1 // not even the handshake completes
		}
		return 0
	}})
	c := dial(t, cfg.Socket, alloc.WithDataAddr(through), alloc.WithOpTimeout(500*time.Millisecond), alloc.WithBusyPoll(0))
	const n = 8 << 20
	seg, want := rdmaSegment(t, c, n, 5)
	scan(t, seg, want, 0, 1<<20)
	require.Positive(t, alloc.ReadAheadWindow(seg))

	dead.Store(true)
	proxy().KillAll()
	p := make([]byte, 4096)
	var err error
	for off := int64(1 << 20); off < n && err == nil; off += int64(len(p)) {
		done := make(chan error, 1)
		go func() {
			_, err := seg.ReadAt(p, off)
			if err == nil && !bytes.Equal(want[off:off+4096], p) {
				err = fmt.Errorf("wrong bytes at %d", off)
			}
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			t.Fatal("ReadAt still waits for a dead home after a minute")
		}
	}
	require.ErrorIs(t, err, alloc.ErrUnavailable, "the reads ahead that were held may be served, then the home's absence shows")

	dead.Store(false)
	scan(t, seg, want, 1<<20, n)
	require.NoError(t, seg.Close())
	st := c.Stats()
	require.Equal(t, st.PrefetchedBytes, st.PrefetchWastedBytes+st.PrefetchHitBytes, "every byte read ahead was either returned or counted wasted: %+v", st)
}
