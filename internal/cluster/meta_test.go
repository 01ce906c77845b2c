package cluster

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"
)

func TestMetaRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		meta Meta
		boot uint64
	}{
		{"empty", Meta{}, 1},
		{"realistic", testMeta("node-17"), 0xdeadbeefcafef00d},
		{"draining, ipv6", Meta{Proto: 3, GRPCAddr: "[fd00::1]:7070", DataAddr: "[fd00::1]:7071", Draining: true,
			Tiers: []TierFree{{Name: "rdma", Capacity: 1 << 40, Free: 0}}}, math.MaxUint64},
		{"extremes", Meta{Proto: math.MaxUint32, Tiers: []TierFree{{Name: "a", Capacity: math.MaxInt64, Free: math.MaxInt64},
			{Name: strings.Repeat("z", MaxTierName), Capacity: 0, Free: 0}}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := encodeMeta(tc.meta, stamp{boot: tc.boot, capSeq: tc.boot / 3})
			require.NoError(t, err)
			require.LessOrEqual(t, len(b), memberlist.MetaMaxSize)
			got, st, err := decodeMeta(b)
			require.NoError(t, err)
			require.Equal(t, stamp{boot: tc.boot, capSeq: tc.boot / 3}, st)
			if len(tc.meta.Tiers) == 0 {
				tc.meta.Tiers = nil
			}
			require.Equal(t, tc.meta, got)
			n, err := tc.meta.EncodedSize()
			require.NoError(t, err)
			seqLen := 0
			if tc.boot/3 != 0 {
				seqLen = len(binary.AppendUvarint(nil, tc.boot/3))
			}
			require.Equal(t, len(b)-seqLen, n, "EncodedSize leaves the capacity sequence out")
		})
	}
}

func TestRealisticMetaIsSmall(t *testing.T) {
	m := Meta{Proto: 1, GRPCAddr: "poold-rack12-host034.dc1.example.com:7070", DataAddr: "10.12.34.56:7071",
		Tiers: []TierFree{{"cxl", 512 << 30, 300 << 30}, {"local", 64 << 30, 10 << 30}, {"rdma", 1 << 40, 1 << 39}}}
	n, err := m.EncodedSize()
	require.NoError(t, err)
	require.Less(t, n, 150, "a realistic Meta leaves most of memberlist's 512 bytes free")
	t.Logf("realistic Meta: %d bytes of %d", n, memberlist.MetaMaxSize)
}

func TestMetaTooLargeIsRefused(t *testing.T) {
	m := Meta{GRPCAddr: strings.Repeat("g", 200) + ":1", DataAddr: strings.Repeat("d", 200) + ":2"}
	for i := range MaxTiers {
		m.Tiers = append(m.Tiers, TierFree{Name: strings.Repeat(string(rune('a'+i)), MaxTierName), Capacity: math.MaxInt64, Free: math.MaxInt64})
	}
	require.NoError(t, m.Validate(), "every field is within its own limit")
	_, err := m.EncodedSize()
	require.ErrorIs(t, err, ErrMetaTooLarge)
	require.Contains(t, err.Error(), "8 tiers")
	_, err = encodeMeta(m, stamp{boot: 1})
	require.ErrorIs(t, err, ErrMetaTooLarge)
}

func TestMetaValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Meta)
		msg  string
	}{
		{"bad grpc addr", func(m *Meta) { m.GRPCAddr = "no-port" }, "GRPCAddr"},
		{"control byte in addr", func(m *Meta) { m.DataAddr = "host\n:1" }, "printable"},
		{"addr too long", func(m *Meta) { m.DataAddr = strings.Repeat("x", MaxAddr) + ":1" }, "at most 255"},
		{"too many tiers", func(m *Meta) {
			for i := range MaxTiers {
				m.Tiers = append(m.Tiers, TierFree{Name: "t" + string(rune('a'+i))})
			}
		}, "tiers, at most"},
		{"empty tier name", func(m *Meta) { m.Tiers[0].Name = "" }, "1..16"},
		{"upper-case tier name", func(m *Meta) { m.Tiers[0].Name = "CXL" }, "[a-z0-9._-]"},
		{"long tier name", func(m *Meta) { m.Tiers[0].Name = strings.Repeat("x", MaxTierName+1) }, "1..16"},
		{"duplicate tier", func(m *Meta) { m.Tiers[1].Name = "cxl" }, "twice"},
		{"negative capacity", func(m *Meta) { m.Tiers[0].Capacity = -1 }, "0 <= free <= capacity"},
		{"negative free", func(m *Meta) { m.Tiers[0].Free = -1 }, "0 <= free <= capacity"},
		{"free above capacity", func(m *Meta) { m.Tiers[0].Free = m.Tiers[0].Capacity + 1 }, "0 <= free <= capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testMeta("n")
			tc.edit(&m)
			err := m.Validate()
			require.ErrorIs(t, err, ErrInvalidMeta)
			require.Contains(t, err.Error(), tc.msg)
			_, err = encodeMeta(m, stamp{boot: 1})
			require.ErrorIs(t, err, ErrInvalidMeta)
		})
	}
}

func TestDecodeMetaRejects(t *testing.T) {
	good, err := encodeMeta(testMeta("n"), stamp{boot: 7})
	require.NoError(t, err)
	t.Run("every truncation", func(t *testing.T) {
		for i := range len(good) {
			_, _, err := decodeMeta(good[:i])
			require.ErrorIs(t, err, ErrBadMeta, "prefix of %d bytes", i)
		}
	})
	for _, tc := range []struct {
		name string
		b    []byte
		msg  string
	}{
		{"other version", append([]byte{2}, good[1:]...), "format version 2"},
		{"json", []byte(`{"proto":1}`), "format version 123"},
		{"tier count over limit", header(0, 0, "", "", MaxTiers+1), "tier count"},
		{"proto over uint32", binary.AppendUvarint(append([]byte{1, 0}, make([]byte, 8)...), math.MaxUint32+1), "proto"},
		{"string longer than the rest", append(header(0, 1, "", "", 0)[:11], 50, 'a'), "announced"},
		{"invalid tier name", append(header(0, 1, "", "", 1), 3, 'C', 'X', 'L', 0, 0), "[a-z0-9._-]"},
		{"free above capacity", append(header(0, 1, "", "", 1), 3, 'c', 'x', 'l', 1, 2), "free"},
		{"overlong varint", append(header(0, 1, "", "", 1), 3, 'c', 'x', 'l', 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01), "varint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeMeta(tc.b)
			require.ErrorIs(t, err, ErrBadMeta)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestDecodeMetaIsForwardCompatible(t *testing.T) {
	b, err := encodeMeta(testMeta("n"), stamp{boot: 9})
	require.NoError(t, err)
	old, _, err := decodeMeta(b)
	require.NoError(t, err, "a writer that predates the capacity sequence")
	require.Equal(t, testMeta("n"), old)
	b[1] |= 0x80                                    // a flag from a newer version
	b = append(b, 0x05, 0x01, 0x01, 'z', 0x03, 'x') // capacity sequence 5, draining since 1, zone "z", then fields appended by a newer version
	got, st, err := decodeMeta(b)
	require.NoError(t, err)
	require.Equal(t, stamp{boot: 9, capSeq: 5}, st)
	want := testMeta("n")
	want.DrainingSince, want.Zone = 1, "z"
	require.Equal(t, want, got)
}

// A zone travels after the drain's start, which is then written (0 when not
// draining), and a bad zone is refused on both sides.
func TestMetaZone(t *testing.T) {
	m := testMeta("n")
	m.Zone = "rack-7.eu-west"
	b, err := encodeMeta(m, stamp{boot: 9})
	require.NoError(t, err)
	got, _, err := decodeMeta(b)
	require.NoError(t, err)
	require.Equal(t, m, got)
	plain, err := encodeMeta(testMeta("n"), stamp{boot: 9})
	require.NoError(t, err)
	require.Equal(t, plain, b[:len(plain)], "the fields before it are laid out as before")
	require.Equal(t, append([]byte{0, 0, byte(len(m.Zone))}, m.Zone...), b[len(plain):])
	for _, bad := range []string{"Rack", "a b", "zone\n", strings.Repeat("z", MaxZone+1)} {
		m.Zone = bad
		require.ErrorIs(t, m.Validate(), ErrInvalidMeta, bad)
		require.Error(t, ValidZone(bad))
		_, _, err := decodeMeta(append(slices.Clone(plain), append([]byte{0, 0, byte(len(bad))}, bad...)...))
		require.ErrorIs(t, err, ErrBadMeta, bad)
	}
	require.NoError(t, ValidZone(strings.Repeat("z", MaxZone)))
}

// A drain's start travels after the capacity sequence, which is then
// written even when 0; a reader that predates the field ignores it.
func TestMetaDrainingSince(t *testing.T) {
	m := testMeta("n")
	m.Draining, m.DrainingSince = true, 1_733_366_400_000
	for _, seq := range []uint64{0, 7} {
		b, err := encodeMeta(m, stamp{boot: 9, capSeq: seq})
		require.NoError(t, err)
		got, st, err := decodeMeta(b)
		require.NoError(t, err)
		require.Equal(t, m, got)
		require.Equal(t, stamp{boot: 9, capSeq: seq}, st)
		plain, err := encodeMeta(testMeta("n"), stamp{boot: 9, capSeq: seq})
		require.NoError(t, err)
		plain[1] |= flagDraining
		n := len(plain)
		if seq == 0 {
			n++ // the sequence, written for the field after it
		}
		require.Equal(t, plain, b[:len(plain)], "the fields before it are laid out as before")
		require.Equal(t, binary.AppendUvarint(nil, uint64(m.DrainingSince)), b[n:])
	}
	m.DrainingSince = -1
	require.ErrorIs(t, m.Validate(), ErrInvalidMeta)
}

// TestMetaEvacuating: the evacuation is one more flag bit, after the
// drain's; the rest of the encoding is as without it, and a reader that
// predates the bit (which ignores unknown bits) reads a drain.
func TestMetaEvacuating(t *testing.T) {
	m := testMeta("n")
	m.Draining, m.DrainingSince, m.Evacuating = true, 1_733_366_400_000, true
	b, err := encodeMeta(m, stamp{boot: 9, capSeq: 3})
	require.NoError(t, err)
	got, _, err := decodeMeta(b)
	require.NoError(t, err)
	require.Equal(t, m, got)
	require.Equal(t, byte(flagDraining|flagEvacuating), b[1])
	m.Evacuating = false
	plain, err := encodeMeta(m, stamp{boot: 9, capSeq: 3})
	require.NoError(t, err)
	plain[1] |= flagEvacuating
	require.Equal(t, plain, b, "only the flag bit differs")
	old := slices.Clone(b)
	old[1] &^= flagEvacuating
	got, _, err = decodeMeta(old)
	require.NoError(t, err)
	require.True(t, got.Draining)
	require.False(t, got.Evacuating)
	evac := got.Clone()
	evac.Evacuating = true
	require.False(t, freeOnly(got, evac), "a change of the flag is no free-bytes-only change: a capacity update cannot carry it")
}

func TestMetaCloneSharesNothing(t *testing.T) {
	m := testMeta("n")
	c := m.Clone()
	c.Tiers[0].Free = 0
	require.NotZero(t, m.Tiers[0].Free)
	tf, ok := m.Tier("rdma")
	require.True(t, ok)
	require.Equal(t, int64(100<<30), tf.Free)
	_, ok = m.Tier("tape")
	require.False(t, ok)
}

// header encodes a version-1 prefix up to and including the tier count.
func header(flags byte, proto uint64, grpc, data string, tiers uint64) []byte {
	b := append([]byte{1, flags}, make([]byte, 8)...)
	b = binary.AppendUvarint(b, proto)
	b = appendString(b, grpc)
	b = appendString(b, data)
	return binary.AppendUvarint(b, tiers)
}
