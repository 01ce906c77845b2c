package alloc_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
)

// An attacher that closes its segment leaves it, and its bytes, to the
// owner; it can no longer map it by id. Free by an attacher that may free
// it (here the creator's identity: the same uid on the socket), in
// contrast, deletes the segment for everyone.
func TestAttacherCloseLeavesSegment(t *testing.T) {
	cfg, owner := startPool(t)
	ctx := t.Context()
	for _, tier := range []alloc.Tier{alloc.TierLocal, alloc.TierCXL, alloc.TierRDMA} {
		t.Run(tier.String(), func(t *testing.T) {
			name := "close-" + tier.String()
			seg, err := owner.Alloc(ctx, 8192, alloc.WithTier(tier), alloc.WithName(name))
			require.NoError(t, err)
			_, err = seg.WriteAt([]byte("owner's bytes"), 100)
			require.NoError(t, err)

			attacher := dial(t, cfg.Socket)
			seen, err := attacher.Attach(ctx, name)
			require.NoError(t, err)
			_, err = seen.WriteAt([]byte("attacher's"), 4000)
			require.NoError(t, err)
			require.NoError(t, seen.Close())
			require.NoError(t, seen.Close(), "Close is idempotent")

			requireClosed(t, seen)
			require.ErrorIs(t, seen.Free(ctx), alloc.ErrClosed, "Free after Close")
			_, err = attacher.Open(ctx, seg.ID())
			require.ErrorIs(t, err, alloc.ErrAccessDenied, "the attachment was given up on the daemon")

			got := make([]byte, 13)
			_, err = seg.ReadAt(got, 100)
			require.NoError(t, err)
			require.Equal(t, "owner's bytes", string(got))
			got = make([]byte, 10)
			_, err = seg.ReadAt(got, 4000)
			require.NoError(t, err)
			require.Equal(t, "attacher's", string(got))

			// Free by an attacher frees the segment for the owner too.
			again, err := attacher.Attach(ctx, name)
			require.NoError(t, err)
			require.NoError(t, again.Free(ctx))
			_, err = owner.Attach(ctx, name)
			require.ErrorIs(t, err, alloc.ErrNotFound)
			require.ErrorIs(t, owner.FreeByID(ctx, seg.ID()), alloc.ErrNotFound)
			require.NoError(t, seg.Close(), "Close of a segment freed meanwhile")
		})
	}
}

// Close on the owner's own segment unmaps it and leaves it allocated: the
// owner can open it again by id.
func TestOwnerCloseKeepsSegment(t *testing.T) {
	_, c := startPool(t)
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL), alloc.WithName("kept"))
	require.NoError(t, err)
	_, err = seg.WriteAt([]byte("still here"), 0)
	require.NoError(t, err)
	require.NoError(t, seg.Close())
	_, err = seg.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, alloc.ErrClosed)

	back, err := c.Open(ctx, seg.ID())
	require.NoError(t, err)
	got := make([]byte, 10)
	_, err = back.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "still here", string(got))
	require.NoError(t, back.Free(ctx))
}

// Reads racing Close end with ErrClosed, never a fault, on every mapped
// tier. Each tier runs a few rounds: one read in flight at the moment of
// Close is what used to fault.
func TestCloseDuringReads(t *testing.T) {
	cfg, owner := startPool(t)
	ctx := t.Context()
	for _, tier := range []alloc.Tier{alloc.TierLocal, alloc.TierCXL, alloc.TierLocal, alloc.TierCXL, alloc.TierLocal, alloc.TierCXL} {
		t.Run(tier.String(), func(t *testing.T) {
			name := "race-" + tier.String()
			seg, err := owner.Alloc(ctx, 1<<20, alloc.WithTier(tier), alloc.WithName(name))
			require.NoError(t, err)
			defer seg.Free(ctx)
			attacher := dial(t, cfg.Socket)
			seen, err := attacher.Attach(ctx, name)
			require.NoError(t, err)
			var wg sync.WaitGroup
			errc := make(chan error, 8)
			for range 4 {
				wg.Go(func() {
					p := make([]byte, 64<<10)
					for {
						if _, err := seen.ReadAt(p, 0); err != nil {
							errc <- err
							return
						}
					}
				})
			}
			time.Sleep(10 * time.Millisecond)
			require.NoError(t, seen.Close())
			wg.Wait()
			close(errc)
			for err := range errc {
				require.True(t, errors.Is(err, alloc.ErrClosed), "a read racing Close: %v", err)
			}
			got := make([]byte, 4)
			_, err = seg.ReadAt(got, 0)
			require.NoError(t, err, "the owner still reads")
		})
	}
}
