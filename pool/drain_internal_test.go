package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
)

// The drain's start is committed to the store and read back after a
// reopen; an undo removes it; a damaged record stops the open with a
// message naming the store and what to do.
func TestStoreDrainSince(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, true)
	require.NoError(t, err)
	since, err := st.drainSince()
	require.NoError(t, err)
	require.True(t, since.IsZero(), "a new store drains nothing")
	start := time.UnixMilli(1_733_366_400_123)
	require.NoError(t, st.setDrainSince(start))
	require.NoError(t, st.close())

	st, err = openStore(dir, true)
	require.NoError(t, err)
	since, err = st.drainSince()
	require.NoError(t, err)
	require.True(t, start.Equal(since), "read back %v, wrote %v", since, start)
	require.NoError(t, st.setDrainSince(time.Time{}))
	since, err = st.drainSince()
	require.NoError(t, err)
	require.True(t, since.IsZero())

	require.NoError(t, st.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyDrainSince, []byte{1, 2, 3}) }, false))
	_, err = st.drainSince()
	require.ErrorContains(t, err, `drain record "drain-since" of 3 bytes, want 8: `+st.path+" is damaged; restore the data directory from a backup")
	require.NoError(t, st.close())
}
