package alloc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
)

func newArena(t *testing.T, c *alloc.Client, opts ...alloc.ArenaOption) *alloc.Arena {
	t.Helper()
	a, err := alloc.NewArena(c, append([]alloc.ArenaOption{alloc.ArenaSegmentSize(8 << 20)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close(context.Background())) })
	return a
}

// startBigPool starts a daemon with 512 MiB of cxl and rdma: arenas hold a
// slab per size class in use, so random sizes need room.
func startBigPool(t *testing.T) *alloc.Client {
	cfg := pooltest.Config(t)
	cfg.EmulateCXL = 512 * size.MiB
	cfg.ExportSize = 512 * size.MiB
	pooltest.Start(t, cfg)
	return dial(t, cfg.Socket)
}

func TestSizeClasses(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, 16}, {16, 16}, {17, 32}, {128, 128}, {129, 144}, {256, 256}, {257, 288},
		{1000, 1024}, {1025, 1152}, {1064, 1152}, {1 << 20, 1 << 20}, {1<<20 - 1, 1 << 20}, {917505, 983040}, {983041, 1 << 20},
		{0, 0}, {-1, 0}, {1<<20 + 1, 0},
	} {
		require.Equal(t, tc.want, alloc.SizeClass(tc.n), "SizeClass(%d)", tc.n)
	}
	prev := 0
	for n := 1; n <= alloc.MaxObjectSize; n += 1 + n/64 {
		c := alloc.SizeClass(n)
		require.GreaterOrEqual(t, c, n)
		require.GreaterOrEqual(t, c, prev, "classes grow with n")
		require.Zero(t, c%16, "slots are 16-byte aligned")
		require.True(t, c-n < 16 || float64(c-n) <= float64(c)/8, "n=%d class %d wastes more than 12.5%%", n, c)
		prev = c
	}
}

func TestArenaEachTier(t *testing.T) {
	_, c := startPool(t)
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierLocal, alloc.TierRDMA} {
		t.Run(tier.String(), func(t *testing.T) {
			a := newArena(t, c, alloc.ArenaTier(tier))
			msg := []byte("small object in far memory")
			r, err := a.Alloc(len(msg))
			require.NoError(t, err)
			require.NotZero(t, r)
			n, err := a.WriteAt(r, msg, 0)
			require.NoError(t, err)
			require.Equal(t, len(msg), n)
			got := make([]byte, len(msg)+10)
			n, err = a.ReadAt(r, got, 0)
			require.ErrorIs(t, err, io.EOF, "a read past the object's end is short")
			require.Equal(t, msg, got[:n])
			l, err := a.Len(r)
			require.NoError(t, err)
			require.Equal(t, len(msg), l)
			tr, err := a.Tier(r)
			require.NoError(t, err)
			require.Equal(t, tier, tr)
			_, err = a.WriteAt(r, msg, 1)
			require.ErrorIs(t, err, alloc.ErrOutOfRange, "a write past the end writes nothing")
			b, err := a.Bytes(r)
			slot, serr := a.SlotBytes(r)
			if tier == alloc.TierRDMA {
				require.ErrorIs(t, err, alloc.ErrNotSupported)
				require.ErrorIs(t, serr, alloc.ErrNotSupported)
			} else {
				require.NoError(t, err)
				require.Equal(t, msg, b)
				require.NoError(t, serr)
				require.Len(t, slot, alloc.SizeClass(len(msg)), "the whole slot")
				require.Equal(t, msg, slot[:len(msg)])
				require.Equal(t, &b[0], &slot[0], "the same memory")
			}
			st := a.Stats()
			require.Equal(t, int64(1), st.Objects)
			require.Equal(t, int64(len(msg)), st.Requested)
			require.Equal(t, int64(alloc.SizeClass(len(msg))), st.Allocated)
			require.Equal(t, 1, st.Tiers[tier].Slabs)
			require.Equal(t, int64(8<<20), st.Tiers[tier].Held)
			require.NoError(t, a.Free(r))
			require.NoError(t, a.Trim(t.Context()))
			require.Zero(t, a.Stats().Held)
		})
	}
}

type placed struct {
	ref  alloc.Ref
	n    int
	fill byte
}

// TestArenaProperty runs random Alloc/Free sequences and checks after each
// step that live objects never overlap, keep their contents, and that the
// stats add up; at the end nothing is left held, in the arena or the pool.
func TestArenaProperty(t *testing.T) {
	c := startBigPool(t)
	ctx := t.Context()
	before, err := c.Tiers(ctx)
	require.NoError(t, err)
	for _, seed := range []uint64{1, 2, 3} {
		for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierRDMA} {
			t.Run(tier.String(), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 99))
				a := newArena(t, c, alloc.ArenaTier(tier), alloc.ArenaSegmentSize(4<<20))
				var live []placed
				steps := 3000
				if tier == alloc.TierRDMA {
					steps = 600
				}
				for step := range steps {
					if len(live) > 0 && rng.IntN(100) < 45 {
						i := rng.IntN(len(live))
						p := live[i]
						got := make([]byte, p.n)
						_, err := a.ReadAt(p.ref, got, 0)
						require.NoError(t, err)
						require.Equal(t, bytes.Repeat([]byte{p.fill}, p.n), got, "object %v kept its bytes", p.ref)
						require.NoError(t, a.Free(p.ref))
						require.ErrorIs(t, a.Free(p.ref), alloc.ErrBadRef, "double free")
						live[i] = live[len(live)-1]
						live = live[:len(live)-1]
					} else {
						n := 1 + rng.IntN(600)
						switch rng.IntN(20) {
						case 0:
							n = 1 + rng.IntN(300<<10)
						case 1:
							n = 16
						}
						r, err := a.Alloc(n)
						require.NoError(t, err)
						p := placed{ref: r, n: n, fill: byte(step)}
						_, err = a.WriteAt(r, bytes.Repeat([]byte{p.fill}, n), 0)
						require.NoError(t, err)
						live = append(live, p)
					}
					if step%100 == 0 || step == steps-1 {
						checkArena(t, a, live)
					}
				}
				for _, p := range live {
					require.NoError(t, a.Free(p.ref))
				}
				st := a.Stats()
				require.Zero(t, st.Objects)
				require.Zero(t, st.Requested)
				require.Zero(t, st.Allocated)
				require.NoError(t, a.Trim(ctx))
				st = a.Stats()
				require.Zero(t, st.Held, "an empty, trimmed arena holds no segment")
				require.Zero(t, st.Segments)
				require.Zero(t, st.Slabs)
			})
		}
	}
	after, err := c.Tiers(ctx)
	require.NoError(t, err)
	for i := range before {
		require.Equal(t, before[i].Free, after[i].Free, "tier %s got its memory back", before[i].Tier)
	}
}

// checkArena checks that live objects do not overlap and that the stats add up.
func checkArena(t *testing.T, a *alloc.Arena, live []placed) {
	t.Helper()
	type span struct {
		seg      uint64
		off, end int64
	}
	spans := make([]span, 0, len(live))
	var req, held int64
	for _, p := range live {
		seg, off, size, err := alloc.RefPlace(a, p.ref)
		require.NoError(t, err)
		require.GreaterOrEqual(t, size, int64(p.n))
		spans = append(spans, span{seg, off, off + size})
		req += int64(p.n)
		held += int64(alloc.SizeClass(p.n))
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].seg != spans[j].seg {
			return spans[i].seg < spans[j].seg
		}
		return spans[i].off < spans[j].off
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].seg == spans[i-1].seg {
			require.LessOrEqual(t, spans[i-1].end, spans[i].off, "objects overlap in segment %d", spans[i].seg)
		}
	}
	st := a.Stats()
	require.Equal(t, int64(len(live)), st.Objects)
	require.Equal(t, req, st.Requested)
	require.Equal(t, held, st.Allocated)
	var slabs, segs int
	var bytesHeld int64
	for _, ts := range st.Tiers {
		slabs += ts.Slabs
		segs += ts.Segments
		bytesHeld += ts.Held
	}
	require.Equal(t, st.Slabs, slabs)
	require.Equal(t, st.Segments, segs)
	require.Equal(t, st.Held, bytesHeld)
	require.GreaterOrEqual(t, st.Held, st.Allocated)
}

func TestArenaBadRefs(t *testing.T) {
	_, c := startPool(t)
	a := newArena(t, c, alloc.ArenaTier(alloc.TierCXL))
	other := newArena(t, c, alloc.ArenaTier(alloc.TierCXL))
	r, err := a.Alloc(64)
	require.NoError(t, err)
	_, err = a.WriteAt(r, bytes.Repeat([]byte{'a'}, 64), 0)
	require.NoError(t, err)
	foreign, err := other.Alloc(64)
	require.NoError(t, err)
	freed, err := a.Alloc(64)
	require.NoError(t, err)
	require.NoError(t, a.Free(freed))
	reused, err := a.Alloc(64) // likely the freed slot, under a new generation
	require.NoError(t, err)
	_, err = a.WriteAt(reused, bytes.Repeat([]byte{'b'}, 64), 0)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		ref  alloc.Ref
	}{
		{"zero", 0},
		{"freed", freed},
		{"foreign", foreign},
		{"forged slot", r + 5000},
		{"forged slab", r + 77<<16},
		{"forged generation", r + 2<<48},
		{"all ones", ^alloc.Ref(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := make([]byte, 64)
			_, err := a.ReadAt(tc.ref, p, 0)
			require.ErrorIs(t, err, alloc.ErrBadRef)
			require.Equal(t, make([]byte, 64), p, "nothing was read")
			_, err = a.WriteAt(tc.ref, p, 0)
			require.ErrorIs(t, err, alloc.ErrBadRef)
			_, err = a.Bytes(tc.ref)
			require.ErrorIs(t, err, alloc.ErrBadRef)
			// SlotBytes does not read the slot's metadata: a freed or
			// never allocated slot, or one under another generation, is
			// still a slot of this arena's; every other bad Ref is refused.
			if _, err = a.SlotBytes(tc.ref); tc.ref == freed || tc.ref == r+5000 || tc.ref == r+2<<48 {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, alloc.ErrBadRef)
			}
			_, err = a.Len(tc.ref)
			require.ErrorIs(t, err, alloc.ErrBadRef)
			require.ErrorIs(t, a.Free(tc.ref), alloc.ErrBadRef)
		})
	}
	got := make([]byte, 64)
	_, err = a.ReadAt(r, got, 0)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{'a'}, 64), got, "bad refs changed nothing")
	_, err = a.ReadAt(reused, got, 0)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{'b'}, 64), got)
	require.Equal(t, int64(2), a.Stats().Objects)

	require.NoError(t, a.Close(t.Context()))
	_, err = a.ReadAt(r, got, 0)
	require.ErrorIs(t, err, alloc.ErrBadRef, "refs die with their arena")
	_, err = a.Alloc(8)
	require.ErrorIs(t, err, alloc.ErrClosed)
}

func TestArenaLimits(t *testing.T) {
	_, c := startPool(t)
	a := newArena(t, c, alloc.ArenaTier(alloc.TierCXL), alloc.ArenaLimit(8<<20))
	for _, n := range []int{0, -1} {
		_, err := a.Alloc(n)
		require.ErrorIs(t, err, alloc.ErrInvalid)
	}
	_, err := a.Alloc(alloc.MaxObjectSize + 1)
	require.ErrorIs(t, err, alloc.ErrTooLarge)

	big, err := a.Alloc(alloc.MaxObjectSize)
	require.NoError(t, err)
	data := bytes.Repeat([]byte{7}, alloc.MaxObjectSize)
	_, err = a.WriteAt(big, data, 0)
	require.NoError(t, err)
	got := make([]byte, alloc.MaxObjectSize)
	_, err = a.ReadAt(big, got, 0)
	require.NoError(t, err)
	require.Equal(t, data, got, "a largest-class object is whole")

	var refs []alloc.Ref
	for {
		r, err := a.Alloc(100 << 10)
		if err != nil {
			require.ErrorIs(t, err, alloc.ErrNoCapacity, "the arena stops at its limit")
			break
		}
		refs = append(refs, r)
	}
	require.LessOrEqual(t, a.Stats().Held, int64(8<<20))
	for _, r := range refs {
		require.NoError(t, a.Free(r))
	}

	for _, opt := range []alloc.ArenaOption{
		alloc.ArenaSegmentSize(100), alloc.ArenaSegmentSize(128 << 20), alloc.ArenaSegmentSize(3<<20 + 1),
		alloc.ArenaLimit(-1), alloc.ArenaTier(alloc.Tier(9)),
	} {
		_, err := alloc.NewArena(c, opt)
		require.ErrorIs(t, err, alloc.ErrInvalid)
	}
	_, err = alloc.NewArena(nil)
	require.ErrorIs(t, err, alloc.ErrInvalid)
}

func TestArenaNoCapacityInPool(t *testing.T) {
	_, c := startPool(t) // 64 MiB of cxl
	a := newArena(t, c, alloc.ArenaTier(alloc.TierCXL), alloc.ArenaSegmentSize(32<<20))
	var err error
	for range 200 {
		if _, err = a.Alloc(512 << 10); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, alloc.ErrNoCapacity)
}

func TestArenaConcurrent(t *testing.T) {
	c := startBigPool(t)
	a := newArena(t, c, alloc.ArenaTier(alloc.TierCXL))
	const workers, rounds = 8, 2000
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var mine []placed
			for i := range rounds {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					p := mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					got := make([]byte, p.n)
					if _, err := a.ReadAt(p.ref, got, 0); err != nil {
						errc <- err
						return
					}
					if !bytes.Equal(got, bytes.Repeat([]byte{p.fill}, p.n)) {
						errc <- errors.New("an object lost its bytes to another goroutine's object")
						return
					}
					if err := a.Free(p.ref); err != nil {
						errc <- err
						return
					}
					continue
				}
				n := 1 + rng.IntN(2048)
				r, err := a.Alloc(n)
				if err != nil {
					errc <- err
					return
				}
				p := placed{r, n, byte(w*31 + i)}
				if _, err := a.WriteAt(r, bytes.Repeat([]byte{p.fill}, n), 0); err != nil {
					errc <- err
					return
				}
				mine = append(mine, p)
			}
			for _, p := range mine {
				if err := a.Free(p.ref); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	go func() {
		for range 50 {
			_ = a.Stats()
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	require.Zero(t, a.Stats().Objects)
}

type point struct {
	X, Y int64
	Tag  [4]byte
	Ok   bool
}

func TestSlab(t *testing.T) {
	_, c := startPool(t)
	a := newArena(t, c, alloc.ArenaTier(alloc.TierCXL))
	s, err := alloc.NewSlab[point](a)
	require.NoError(t, err)
	r, err := s.New(point{X: 1, Y: 2, Tag: [4]byte{'a'}, Ok: true})
	require.NoError(t, err)
	v, err := s.Load(r)
	require.NoError(t, err)
	require.Equal(t, point{X: 1, Y: 2, Tag: [4]byte{'a'}, Ok: true}, v)
	p, err := s.Pointer(r)
	require.NoError(t, err)
	p.X = 42
	v, err = s.Load(r)
	require.NoError(t, err)
	require.Equal(t, int64(42), v.X, "Pointer is the object in place")
	require.NoError(t, s.Store(r, point{Y: 9}))
	require.NoError(t, s.Free(r))
	_, err = s.Load(r)
	require.ErrorIs(t, err, alloc.ErrBadRef)

	remote := newArena(t, c, alloc.ArenaTier(alloc.TierRDMA))
	rs, err := alloc.NewSlab[point](remote)
	require.NoError(t, err)
	r, err = rs.New(point{X: 5})
	require.NoError(t, err)
	v, err = rs.Load(r)
	require.NoError(t, err)
	require.Equal(t, int64(5), v.X)
	_, err = rs.Pointer(r)
	require.ErrorIs(t, err, alloc.ErrNotSupported)
	require.NoError(t, rs.Free(r))
}

func TestSlabRejectsPointers(t *testing.T) {
	_, c := startPool(t)
	a := newArena(t, c)
	check := func(name string, mk func() error) {
		t.Run(name, func(t *testing.T) { require.ErrorIs(t, mk(), alloc.ErrInvalid) })
	}
	check("pointer", func() error { _, err := alloc.NewSlab[*int](a); return err })
	check("string", func() error { _, err := alloc.NewSlab[string](a); return err })
	check("slice", func() error { _, err := alloc.NewSlab[[]byte](a); return err })
	check("map", func() error { _, err := alloc.NewSlab[map[int]int](a); return err })
	check("interface", func() error { _, err := alloc.NewSlab[any](a); return err })
	check("chan", func() error { _, err := alloc.NewSlab[chan int](a); return err })
	check("func", func() error { _, err := alloc.NewSlab[func()](a); return err })
	check("nested string", func() error {
		_, err := alloc.NewSlab[struct {
			A int
			B [2]struct{ S string }
		}](a)
		return err
	})
	check("empty", func() error { _, err := alloc.NewSlab[struct{}](a); return err })
	check("too large", func() error { _, err := alloc.NewSlab[[alloc.MaxObjectSize + 1]byte](a); return err })
	check("no arena", func() error { _, err := alloc.NewSlab[int](nil); return err })
	_, err := alloc.NewSlab[[3]struct {
		A uint8
		B float64
		C complex128
	}](a)
	require.NoError(t, err)
}
