package pool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// v0Records are the segments in testdata/store-v0/segments.db, which the
// JSON writer of version 0 wrote (see the README there).
func v0Records(t testing.TB) []*record {
	at := time.Date(2026, 12, 4, 10, 11, 12, 345678901, time.UTC)
	key := func(s string) rdma.Key {
		k, err := rdma.ParseKey(s)
		require.NoError(t, err)
		return k
	}
	yes, no := true, false
	return []*record{
		{ID: 1, Tier: poolv1.Tier_TIER_CXL, Device: "cxl-emu0", Offset: 0, Extent: 2 << 20, Size: 4096, Owner: "client-a", Epoch: 1, Created: at},
		{ID: 2, Name: "shared-cache", Tier: poolv1.Tier_TIER_LOCAL, Device: "local0", Offset: 2 << 20, Extent: 4 << 20, Size: 3 << 20, Owner: "client-a", Epoch: 1, Created: at.Add(time.Second),
			Attached: []string{"client-b", "client-c"}, Creator: "uid:1000", Allow: []string{"uid:1001", "cn:web"}, AllowFree: []string{"uid:1001"}, Grants: true},
		{ID: 3, Tier: poolv1.Tier_TIER_RDMA, Device: "export0", Offset: 4096, Extent: 8192, Size: 8000, Owner: "client-b", Persist: true, Epoch: 3, Created: at.Add(2 * time.Second),
			Key: key("00112233445566778899aabbccddeeff")},
		{ID: 4, Name: "remote-tls", Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 1 << 20, Owner: "client-c", Epoch: 2, Created: at.Add(3 * time.Second),
			Key: key("ffeeddccbbaa99887766554433221100"), Home: "node-b", HomeID: 77, DataAddr: "10.0.0.2:7947", DataTLS: &yes, Creator: "cn:app", Grants: true},
		{ID: 5, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 65536, Owner: "client-c", Epoch: 1, Created: at.Add(4 * time.Second),
			Key: key("0102030405060708090a0b0c0d0e0f10"), Home: "node-c", HomeID: 9, DataAddr: "[fd00::3]:7947", DataTLS: &no},
		{ID: 6, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 100, Owner: "client-d", Epoch: 1, Created: at.Add(5 * time.Second),
			Key: key("a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"), Home: "node-d", HomeID: 1, DataAddr: "10.0.0.4:7947"},
		{ID: 1030, Name: "pre-grants", Tier: poolv1.Tier_TIER_CXL, Device: "dax0.0", Offset: 6 << 20, Extent: 2 << 20, Size: 2 << 20, Epoch: 5, Created: at.Add(6 * time.Second), Lost: true},
	}
}

// rawRecords returns the segments bucket's values by key.
func rawRecords(t *testing.T, st *store) map[string][]byte {
	out := map[string][]byte{}
	require.NoError(t, st.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSegments).ForEach(func(k, v []byte) error {
			out[string(k)] = bytes.Clone(v)
			return nil
		})
	}))
	return out
}

// TestStoreMigratesV0: a store the JSON writer of version 0 wrote opens with
// every segment as it was, its records rewritten in the current form in the
// same open, and opens again unchanged.
func TestStoreMigratesV0(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "store-v0", storeFileName))
	require.NoError(t, err)
	require.Contains(t, string(old), `"tier":"local"`, "the fixture holds version 0 records")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, storeFileName), old, 0o600))

	want := v0Records(t)
	st, err := openStore(dir, true)
	require.NoError(t, err)
	recs, next, rewritten, err := st.load()
	require.NoError(t, err)
	require.Equal(t, want, recs)
	require.Equal(t, uint64(2048), next, "next-id kept")
	require.Equal(t, len(want), rewritten)
	raw := rawRecords(t, st)
	require.Len(t, raw, len(want))
	for k, v := range raw {
		require.Equal(t, byte(recordVersion), v[0], "record %x rewritten", k)
	}
	require.NoError(t, st.close())

	st, err = openStore(dir, true)
	require.NoError(t, err)
	defer st.close()
	recs, next, rewritten, err = st.load()
	require.NoError(t, err)
	require.Equal(t, want, recs)
	require.Equal(t, uint64(2048), next)
	require.Zero(t, rewritten, "nothing left to rewrite")
	require.Equal(t, raw, rawRecords(t, st))
}

// TestRecordRoundTrip: every field survives the encoding, and the form is
// smaller than the JSON it replaces.
func TestRecordRoundTrip(t *testing.T) {
	sealed := *v0Records(t)[2]
	sealed.Sealed = true
	for _, r := range append(v0Records(t), &record{}, &record{ID: 1<<64 - 1, Offset: -1, Created: time.Time{}}, &sealed) {
		v, err := encodeRecord(r)
		require.NoError(t, err)
		back, legacy, err := decodeRecord(v)
		require.NoError(t, err)
		require.False(t, legacy)
		require.Equal(t, r, back)
	}
	r := v0Records(t)[3]
	v, err := encodeRecord(r)
	require.NoError(t, err)
	old, err := os.ReadFile(filepath.Join("testdata", "store-v0", storeFileName))
	require.NoError(t, err)
	i := bytes.Index(old, []byte(`{"id":4,`))
	require.GreaterOrEqual(t, i, 0)
	j := bytes.IndexByte(old[i:], '}')
	t.Logf("record 4: %d bytes, %d as JSON", len(v), j+1)
	require.Less(t, len(v), j+1)
}

// TestRecordRefused: a record of a newer version is refused with an error
// that says to upgrade poold, and a store holding one does not open;
// corrupt records fail with errRecordCorrupt; neither panics.
func TestRecordRefused(t *testing.T) {
	v, err := encodeRecord(v0Records(t)[1])
	require.NoError(t, err)
	newer := append([]byte{recordVersion + 1}, v[1:]...)
	_, _, err = decodeRecord(newer)
	require.ErrorIs(t, err, errRecordVersion)
	require.ErrorIs(t, err, errs.ErrNotSupported)
	require.ErrorContains(t, err, "upgrade poold")

	for name, b := range map[string][]byte{
		"empty":          nil,
		"cut short":      v[:len(v)-1],
		"trailing bytes": append(bytes.Clone(v), 0),
		"unknown tier":   append([]byte{recordVersion, 1, 0, 9}, v[4:]...),
		"unknown flag":   append([]byte{recordVersion, 1, 0x80, 0x10}, v[3:]...),
		"sealed in v2":   append([]byte{2, 1, 0x40}, v[3:]...),
		"json garbage":   []byte(`{"id":`),
		"json tier":      []byte(`{"id":1,"tier":"fast"}`),
		"json key":       []byte(`{"id":1,"tier":"cxl","key":"zz"}`),
	} {
		_, _, err := decodeRecord(b)
		require.ErrorIs(t, err, errRecordCorrupt, name)
	}

	// A daemon whose store holds one does not start, and says why.
	cfg := testConfig(t)
	st, err := openStore(cfg.DataDir, false)
	require.NoError(t, err)
	require.NoError(t, st.put(v0Records(t)[0]))
	require.NoError(t, st.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSegments).Put(idKey(2), newer)
	}))
	require.NoError(t, st.close())
	_, err = New(cfg, nil)
	require.ErrorIs(t, err, errRecordVersion)
	require.ErrorContains(t, err, "upgrade poold")
}

// FuzzDecodeRecord: a stored record either decodes to one whose current
// form decodes to the same, or fails with errRecordVersion or
// errRecordCorrupt; never a panic.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range v0Records(f) {
		v, err := encodeRecord(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v)
	}
	for _, r := range redundantRecords(f) {
		v, err := encodeRecord(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(v)
	}
	f.Add([]byte(`{"id":3,"tier":"rdma","device":"export0","key":"00112233445566778899aabbccddeeff","data_tls":true,"attached":[]}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		r, _, err := decodeRecord(v)
		if err != nil {
			if !errors.Is(err, errRecordVersion) && !errors.Is(err, errRecordCorrupt) {
				t.Fatalf("decodeRecord(%q): %v matches neither errRecordVersion nor errRecordCorrupt", v, err)
			}
			return
		}
		enc, err := encodeRecord(r)
		if err != nil {
			t.Fatalf("decodeRecord(%q) = %+v, which does not encode: %v", v, r, err)
		}
		back, legacy, err := decodeRecord(enc)
		if err != nil || legacy {
			t.Fatalf("decodeRecord(%q) = %+v, whose form %q decodes to %v, %v", v, r, enc, legacy, err)
		}
		again, err := encodeRecord(back)
		if err != nil || !bytes.Equal(enc, again) {
			t.Fatalf("decodeRecord(%q) = %+v encodes to %q, which decodes to %+v encoding to %q (%v)", v, r, enc, back, again, err)
		}
	})
}

// TestRecordDelegates: version 2 carries a record's delegates; a version 1
// record (no delegates field) still reads, as one with none.
func TestRecordDelegates(t *testing.T) {
	r := &record{ID: 7, Owner: peerClientPrefix + "a", Delegates: []string{"app-1", "app-2"}}
	v, err := encodeRecord(r)
	require.NoError(t, err)
	back, _, err := decodeRecord(v)
	require.NoError(t, err)
	require.Equal(t, r, back)

	r.Delegates = nil
	v, err = encodeRecord(r)
	require.NoError(t, err)
	v1 := append([]byte{1}, v[1:len(v)-1-v4Tail]...) // version 1: no delegates count
	back, legacy, err := decodeRecord(v1)
	require.NoError(t, err)
	require.False(t, legacy)
	require.Equal(t, r, back)
	_, _, err = decodeRecord(append(v1, 0))
	require.ErrorIs(t, err, errRecordCorrupt, "a version 1 record has nothing after allow free")
}

// v4Tail is the bytes version 4 adds after the delegates of a record that
// is not redundant: three zero counts of copies and shards, no homes, no
// shard chunk, no writers.
const v4Tail = 6

// redundantRecords are records with every field version 4 added: a
// replicated segment at its origin with a lost and a rebuilding home, an
// erasure-coded one that took fewer parity shards over TLS, a copy a
// peer placed here that its primary writes, and a primary that forwards.
func redundantRecords(t testing.TB) []*record {
	at := time.Date(2026, 12, 5, 8, 0, 0, 5, time.UTC)
	k := func(b byte) rdma.Key {
		var key rdma.Key
		for i := range key {
			key[i] = b + byte(i)
		}
		return key
	}
	no, yes := false, true
	rep := &record{ID: 10, Name: "replicated", Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 1 << 20, Owner: "app", Persist: true, Epoch: 2, Created: at,
		Redundancy: redundancy{Replicas: 3},
		Homes: []homeRef{
			{Node: "b", HomeID: 7, DataAddr: "10.0.0.2:7960", Key: k(1), Epoch: 2},
			{Node: "c", HomeID: 8, DataAddr: "10.0.0.3:7960", Key: k(2), Epoch: 1, State: poolv1.HomeState_HOME_STATE_LOST},
			{Node: "d", HomeID: 9, DataAddr: "10.0.0.4:7960", Key: k(3), Epoch: 2, State: poolv1.HomeState_HOME_STATE_REBUILDING, Rebuilt: 65536},
		}}
	rep.settle()
	rep.DataTLS = &no
	ec := &record{ID: 11, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 2 * 4 * shardChunk, Owner: "app", Epoch: 1, Created: at,
		Redundancy: redundancy{Data: 4, Parity: 1, Fallback: true}, ShardChunk: shardChunk}
	for i := range 5 {
		ec.Homes = append(ec.Homes, homeRef{Node: fmt.Sprintf("n%d", i), HomeID: uint64(100 + i), DataAddr: fmt.Sprintf("10.0.1.%d:7960", i), Key: k(byte(16 * i)), Epoch: 1, DataTLS: true})
	}
	ec.settle()
	ec.DataTLS = &yes
	backup := &record{ID: 12, Tier: poolv1.Tier_TIER_RDMA, Device: "export0", Offset: 8192, Extent: 1 << 20, Size: 1 << 20, Owner: "poold/a", Epoch: 2, Created: at,
		Key: k(9), Delegates: []string{"app"}, Writers: []string{"b"}, ReadOnly: true}
	primary := &record{ID: 13, Tier: poolv1.Tier_TIER_RDMA, Device: "export0", Extent: 4096, Size: 4096, Owner: "poold/a", Epoch: 3, Created: at,
		Key: k(7), Forwards: true}
	return []*record{rep, ec, backup, primary}
}

// TestRecordRedundancy: version 4 carries a redundant segment's
// redundancy, homes (state, epoch, bytes rebuilt) and shard chunk, and a
// copy's writers and read-only flag; a version 3 record still reads, as
// one without redundancy, and one with a version 4 flag is corrupt, as is
// a home in an unknown state. Homes that differ in serving TLS are not
// encoded (one configuration for the cluster).
func TestRecordRedundancy(t *testing.T) {
	for _, r := range redundantRecords(t) {
		v, err := encodeRecord(r)
		require.NoError(t, err)
		back, legacy, err := decodeRecord(v)
		require.NoError(t, err)
		require.False(t, legacy)
		require.Equal(t, r, back)
	}
	r := v0Records(t)[3]
	v, err := encodeRecord(r)
	require.NoError(t, err)
	v3 := append([]byte{3}, v[1:len(v)-v4Tail]...)
	back, _, err := decodeRecord(v3)
	require.NoError(t, err)
	require.Equal(t, r, back)
	require.Less(t, v3[2], byte(0x80), "the flags take one byte")
	_, _, err = decodeRecord(append([]byte{3, v3[1], v3[2] | 0x80, flagFallback >> 7}, v3[3:]...))
	require.ErrorIs(t, err, errRecordCorrupt, "a version 4 flag in a version 3 record")

	rep := redundantRecords(t)[0]
	rep.Homes[1].State = poolv1.HomeState(7)
	v, err = encodeRecord(rep)
	require.NoError(t, err)
	_, _, err = decodeRecord(v)
	require.ErrorIs(t, err, errRecordCorrupt, "a home in an unknown state")

	ec := redundantRecords(t)[1]
	ec.Homes[2].DataTLS = false
	_, err = encodeRecord(ec)
	require.ErrorIs(t, err, errs.ErrInvalid)
}
