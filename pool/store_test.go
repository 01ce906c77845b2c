package pool

import (
	"errors"
	"fmt"
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
			require.NoError(t, st.delete(&record{ID: want[0]}, &record{ID: want[1]}))
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

// TestStoreFullFilesystem fills a store file on a 2 MiB tmpfs with
// records, the fsynced file and then the volatile one: a put fails with
// ErrNoCapacity naming the filesystem and health says so; a removal of
// records spread over the whole table in one commit (a leaf rewritten for
// each, more new pages than bbolt has free) commits on the reserve; puts
// commit again on the pages removals freed while health reports the
// reserve missing; once the filesystem grows the reserve is back and
// health is nil; and a reopened store holds exactly what was acknowledged.
func TestStoreFullFilesystem(t *testing.T) {
	for _, volatile := range []bool{false, true} {
		t.Run(map[bool]string{false: "fsynced", true: "volatile"}[volatile], func(t *testing.T) {
			testStoreFull(t, volatile)
		})
	}
}

func testStoreFull(t *testing.T, volatile bool) {
	dir := testfs.SmallFS(t, 2*size.MiB)
	st, err := openStore(dir, true)
	require.NoError(t, err)
	defer func() { st.close() }()
	require.NoError(t, st.health())
	reserve := st.storeFile.reserve
	if volatile {
		reserve = st.volatile.reserve
	}
	require.FileExists(t, reserve)
	rec := func(id uint64, name string) *record {
		return &record{ID: id, Name: name, Tier: poolv1.Tier_TIER_CXL, Volatile: volatile}
	}

	var live []uint64
	var full error
	for id := uint64(1); full == nil; id++ {
		if full = st.put(rec(id, strings.Repeat("n", 100)+fmt.Sprint(id))); full == nil {
			live = append(live, id)
		}
	}
	t.Logf("%d records fill it: %v", len(live), full)
	require.ErrorIs(t, full, errs.ErrNoCapacity)
	require.ErrorContains(t, full, dir)
	require.ErrorContains(t, full, "--data-dir")
	require.ErrorContains(t, st.health(), "cannot commit")

	var gone []*record
	var kept []uint64
	for i, id := range live {
		if i%200 == 0 {
			gone = append(gone, rec(id, ""))
		} else {
			kept = append(kept, id)
		}
	}
	require.NoError(t, st.delete(gone...), "a removal commits on a full filesystem")
	require.NoFileExists(t, reserve, "it needed the reserve")
	require.ErrorContains(t, st.health(), "reserve for frees")

	next := live[len(live)-1] + 1
	for range 8 {
		require.NoError(t, st.put(rec(next, "")), "a put on the pages the removal freed")
		kept = append(kept, next)
		next++
	}
	require.ErrorContains(t, st.health(), "reserve for frees", "still out: the filesystem is full")

	testfs.Resize(t, dir, 4*size.MiB)
	require.NoError(t, st.health())
	require.FileExists(t, reserve)

	require.NoError(t, st.close())
	st, err = openStore(dir, true)
	require.NoError(t, err)
	recs, _, _, err := st.load()
	require.NoError(t, err)
	var got []uint64
	for _, r := range recs {
		require.Equal(t, volatile, r.Volatile, "record %d back from the file it was put in", r.ID)
		got = append(got, r.ID)
	}
	require.Equal(t, kept, got)
}

// TestStoreDurabilityClasses: records of segments in volatile memory are
// committed to the volatile file without an fsync and those of segments
// whose contents survive a power loss to segments.db with one; a reopen on
// the same boot of the host (a poold restart) has both, each in its class;
// a reopen on another boot (the host restarted) has only the fsynced ones
// and the id counter; where the boot id is unknown both files are fsynced;
// and a record in both files stops the load.
func TestStoreDurabilityClasses(t *testing.T) {
	dir := t.TempDir()
	st, err := openStoreBoot(dir, true, "boot-a")
	require.NoError(t, err)
	require.False(t, st.storeFile.db.NoSync, "segments.db is fsynced")
	require.True(t, st.volatile.db.NoSync, "the volatile file is not")
	require.NoError(t, st.reserveIDs(100))
	commits := func() [2]uint64 { return [2]uint64{st.storeFile.commits.Load(), st.volatile.commits.Load()} }
	before := commits()
	vol := func(id uint64, name string) *record {
		return &record{ID: id, Name: name, Tier: poolv1.Tier_TIER_LOCAL, Device: "dram", Owner: "app", Volatile: true}
	}
	for id := uint64(1); id <= 3; id++ {
		require.NoError(t, st.put(vol(id, fmt.Sprint("v", id))))
	}
	require.NoError(t, st.delete(vol(1, "")))
	require.Equal(t, [2]uint64{before[0], before[1] + 4}, commits(), "volatile changes never commit to segments.db")
	pmem := &record{ID: 4, Name: "p", Tier: poolv1.Tier_TIER_CXL, Device: "dax0.0", Owner: "app", Persist: true}
	peer := &record{ID: 5, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Owner: "app", Home: "node-b", HomeID: 9}
	require.NoError(t, st.put(pmem, peer, vol(6, "")), "one put of both classes")
	require.Equal(t, [2]uint64{before[0] + 1, before[1] + 5}, commits())
	require.NoError(t, st.close())

	ids := func(recs []*record) map[uint64]bool {
		out := map[uint64]bool{}
		for _, r := range recs {
			out[r.ID] = r.Volatile
		}
		return out
	}
	st, err = openStoreBoot(dir, true, "boot-a")
	require.NoError(t, err)
	require.False(t, st.dropped)
	recs, next, _, err := st.load()
	require.NoError(t, err)
	require.Equal(t, map[uint64]bool{2: true, 3: true, 4: false, 5: false, 6: true}, ids(recs), "a restart on the same boot has both files")
	require.Equal(t, "v2", recs[0].Name)
	require.Equal(t, uint64(100), next)
	require.NoError(t, st.close())

	st, err = openStoreBoot(dir, true, "boot-b")
	require.NoError(t, err)
	require.True(t, st.dropped)
	recs, next, _, err = st.load()
	require.NoError(t, err)
	require.Equal(t, map[uint64]bool{4: false, 5: false}, ids(recs), "after the host restarted only the fsynced records")
	require.Equal(t, uint64(100), next, "ids stay used")
	require.NoError(t, st.put(vol(7, "")))
	require.NoError(t, st.close())

	st, err = openStoreBoot(dir, true, "")
	require.NoError(t, err)
	require.False(t, st.volatile.db.NoSync, "an unknown boot: the volatile file is fsynced too")
	require.False(t, st.dropped)
	recs, _, _, err = st.load()
	require.NoError(t, err)
	require.Equal(t, map[uint64]bool{4: false, 5: false, 7: true}, ids(recs))

	dup := *pmem
	dup.Volatile = true
	require.NoError(t, st.put(&dup))
	_, _, _, err = st.load()
	require.ErrorIs(t, err, errRecordCorrupt)
	require.ErrorContains(t, err, "segment 4")
	require.ErrorContains(t, err, volatileFileName)
	require.NoError(t, st.close())
}
