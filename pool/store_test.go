package pool

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
)

// TestStoreGroupCommit: concurrent changes are all committed (and reopen
// intact), and a change that fails fails alone, not the others grouped
// with it.
func TestStoreGroupCommit(t *testing.T) {
	for _, fsync := range []bool{true, false} {
		t.Run(map[bool]string{true: "fsync", false: "nosync"}[fsync], func(t *testing.T) {
			dir := t.TempDir()
			st, err := openStore(dir, fsync)
			require.NoError(t, err)
			const n = 64
			bad := errors.New("this change fails")
			var wg sync.WaitGroup
			results := make([]error, n)
			for i := range n {
				wg.Go(func() {
					if i%16 == 5 {
						results[i] = st.update(func(*bolt.Tx) error { return bad }, false)
						return
					}
					results[i] = st.put(&record{ID: uint64(i + 1), Tier: poolv1.Tier_TIER_CXL})
				})
			}
			wg.Wait()
			var want []uint64
			for i, err := range results {
				if i%16 == 5 {
					require.ErrorIs(t, err, bad)
					continue
				}
				require.NoError(t, err, "change %d", i)
				want = append(want, uint64(i+1))
			}
			require.NoError(t, st.delete(want[0], want[1]))
			want = want[2:]
			require.NoError(t, st.close())

			st, err = openStore(dir, fsync)
			require.NoError(t, err)
			defer st.close()
			recs, _, _, err := st.load()
			require.NoError(t, err)
			var got []uint64
			for _, r := range recs {
				got = append(got, r.ID)
			}
			require.Equal(t, want, got)
		})
	}
}

// TestStoreFullFilesystem fills a store on a 2 MiB tmpfs with records: a
// put fails with ErrNoCapacity naming the filesystem and health says so; a
// removal of records spread over the whole table in one commit (a leaf
// rewritten for each, more new pages than bbolt has free) commits on the
// reserve; puts commit again
// on the pages removals freed while health reports the reserve missing;
// once the filesystem grows the reserve is back and health is nil; and a
// reopened store holds exactly what was acknowledged.
func TestStoreFullFilesystem(t *testing.T) {
	dir := testfs.SmallFS(t, 2*size.MiB)
	st, err := openStore(dir, true)
	require.NoError(t, err)
	defer func() { st.close() }()
	require.NoError(t, st.health())
	require.FileExists(t, filepath.Join(dir, reserveFileName))

	var live []uint64
	var full error
	for id := uint64(1); full == nil; id++ {
		if full = st.put(&record{ID: id, Name: strings.Repeat("n", 100) + fmt.Sprint(id), Tier: poolv1.Tier_TIER_CXL}); full == nil {
			live = append(live, id)
		}
	}
	t.Logf("%d records fill it: %v", len(live), full)
	require.ErrorIs(t, full, errs.ErrNoCapacity)
	require.ErrorContains(t, full, dir)
	require.ErrorContains(t, full, "--data-dir")
	require.ErrorContains(t, st.health(), "cannot commit")

	var gone, kept []uint64
	for i, id := range live {
		if i%200 == 0 {
			gone = append(gone, id)
		} else {
			kept = append(kept, id)
		}
	}
	require.NoError(t, st.delete(gone...), "a removal commits on a full filesystem")
	require.NoFileExists(t, filepath.Join(dir, reserveFileName), "it needed the reserve")
	require.ErrorContains(t, st.health(), "reserve for frees")

	next := live[len(live)-1] + 1
	for range 8 {
		require.NoError(t, st.put(&record{ID: next, Tier: poolv1.Tier_TIER_CXL}), "a put on the pages the removal freed")
		kept = append(kept, next)
		next++
	}
	require.ErrorContains(t, st.health(), "reserve for frees", "still out: the filesystem is full")

	testfs.Resize(t, dir, 4*size.MiB)
	require.NoError(t, st.health())
	require.FileExists(t, filepath.Join(dir, reserveFileName))

	require.NoError(t, st.close())
	st, err = openStore(dir, true)
	require.NoError(t, err)
	recs, _, _, err := st.load()
	require.NoError(t, err)
	var got []uint64
	for _, r := range recs {
		got = append(got, r.ID)
	}
	require.Equal(t, kept, got)
}
