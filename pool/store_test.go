package pool

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
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
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					if i%16 == 5 {
						errs[i] = st.update(func(*bolt.Tx) error { return bad })
						return
					}
					errs[i] = st.put(&record{ID: uint64(i + 1), Tier: "cxl"})
				})
			}
			wg.Wait()
			var want []uint64
			for i, err := range errs {
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
			recs, _, err := st.load()
			require.NoError(t, err)
			var got []uint64
			for _, r := range recs {
				got = append(got, r.ID)
			}
			require.Equal(t, want, got)
		})
	}
}
