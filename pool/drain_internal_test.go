package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// The drain's and the evacuation's starts are committed to the store and
// read back after a reopen; an undo removes both; a damaged record stops
// the open with a message naming the store and what to do.
func TestStoreDrainSince(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, true)
	require.NoError(t, err)
	ds, err := st.drainState()
	require.NoError(t, err)
	require.Equal(t, drainState{}, ds, "a new store drains nothing")
	want := drainState{since: time.UnixMilli(1_733_366_400_123), evacSince: time.UnixMilli(1_733_366_500_456)}
	require.NoError(t, st.setDrainState(want))
	require.NoError(t, st.close())

	st, err = openStore(dir, true)
	require.NoError(t, err)
	ds, err = st.drainState()
	require.NoError(t, err)
	require.True(t, want.since.Equal(ds.since), "read back %v, wrote %v", ds.since, want.since)
	require.True(t, want.evacSince.Equal(ds.evacSince), "read back %v, wrote %v", ds.evacSince, want.evacSince)
	require.NoError(t, st.setDrainState(drainState{since: want.since}))
	ds, err = st.drainState()
	require.NoError(t, err)
	require.True(t, ds.evacSince.IsZero(), "the evacuation ended, the drain goes on")
	require.True(t, want.since.Equal(ds.since))
	require.NoError(t, st.setDrainState(drainState{}))
	ds, err = st.drainState()
	require.NoError(t, err)
	require.Equal(t, drainState{}, ds)

	for _, key := range [][]byte{keyDrainSince, keyEvacuateSince} {
		require.NoError(t, st.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(key, []byte{1, 2, 3}) }, false))
		_, err = st.drainState()
		require.ErrorContains(t, err, `drain record "`+string(key)+`" of 3 bytes, want 8: `+st.path+" is damaged; restore the data directory from a backup")
		require.NoError(t, st.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(key) }, true))
	}
	require.NoError(t, st.close())
}
