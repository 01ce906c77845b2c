package cluster

import (
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"
)

// FuzzDecodeMeta feeds arbitrary bytes, as a peer could gossip them, to the
// Meta decoder. It must never panic; whatever it accepts must be a valid
// Meta that encodes and decodes back to itself. The committed seed corpus is
// in testdata/fuzz/FuzzDecodeMeta (regenerate with TestWriteFuzzSeeds).
func FuzzDecodeMeta(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, st, err := decodeMeta(b)
		if err != nil {
			require.ErrorIs(t, err, ErrBadMeta)
			require.Equal(t, Meta{}, m)
			return
		}
		require.NoError(t, m.Validate())
		enc, err := encodeMeta(m, st)
		if err != nil {
			// Only possible for input beyond what memberlist delivers.
			require.ErrorIs(t, err, ErrMetaTooLarge)
			require.Greater(t, len(b), memberlist.MetaMaxSize)
			return
		}
		require.LessOrEqual(t, len(enc), len(b), "the encoding is canonical and never longer than what was read")
		m2, st2, err := decodeMeta(enc)
		require.NoError(t, err)
		require.Equal(t, m, m2)
		require.Equal(t, st, st2)
	})
}

// FuzzDecodeLeave does the same for leave announcements and leave sets,
// which also arrive from peers. testdata/fuzz/FuzzDecodeLeave keeps what the
// fuzzer found (an overlong varint, accepted like Go's binary.Uvarint does).
func FuzzDecodeLeave(f *testing.F) {
	f.Add(encodeLeave("n1", 42))
	f.Add(encodeLeaveSet([]string{"a", "b"}, []uint64{1, 2}))
	f.Add(pushStateWith(capUpdate{name: "c", boot: 3, seq: 4, free: []int64{5}}.encode()))
	f.Add([]byte{msgLeave})
	f.Add([]byte{msgLeaveSet, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		if name, boot, ok := decodeLeave(b); ok {
			require.NotEmpty(t, name)
			enc := encodeLeave(name, boot)
			require.LessOrEqual(t, len(enc), len(b), "varints may be overlong on the wire, never in our encoding")
			name2, boot2, ok := decodeLeave(enc)
			require.True(t, ok)
			require.Equal(t, name, name2)
			require.Equal(t, boot, boot2)
		}
		n := 0
		ncap := 0
		decodePushState(b, func(name string, _ uint64) {
			require.NotEmpty(t, name)
			n++
		}, func(u capUpdate) {
			require.NotEmpty(t, u.name)
			ncap++
		})
		require.LessOrEqual(t, n, maxLeaveSet)
		require.LessOrEqual(t, ncap, maxLeaveSet)
	})
}

// FuzzDecodeCapacity feeds arbitrary bytes to the capacity update decoder,
// as a peer could gossip them. It must never panic; what it accepts must
// encode canonically and decode back to itself. The committed seed corpus is
// in testdata/fuzz/FuzzDecodeCapacity (regenerate with TestWriteFuzzSeeds).
func FuzzDecodeCapacity(f *testing.F) {
	for _, s := range capacitySeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u, ok := decodeCapacity(b)
		if !ok {
			require.Equal(t, capUpdate{}, u)
			return
		}
		require.NotEmpty(t, u.name)
		require.LessOrEqual(t, len(u.free), MaxTiers)
		for _, f := range u.free {
			require.GreaterOrEqual(t, f, int64(0))
		}
		enc := u.encode()
		require.LessOrEqual(t, len(enc), len(b), "varints may be overlong on the wire, never in our encoding")
		u2, ok := decodeCapacity(enc)
		require.True(t, ok)
		require.Equal(t, u, u2)
	})
}

// FuzzDecodeBatch feeds arbitrary bytes to the overflow lane's batch
// decoder, as a peer could send them. It must never panic; what it accepts
// holds no empty message and no batch, and encodes canonically back to a
// batch of the same messages. The committed seed corpus is in
// testdata/fuzz/FuzzDecodeBatch (regenerate with TestWriteFuzzSeeds).
func FuzzDecodeBatch(f *testing.F) {
	for _, s := range batchSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, ok := decodeBatch(b)
		if !ok {
			require.Nil(t, msgs)
			return
		}
		for _, m := range msgs {
			require.NotEmpty(t, m)
			require.NotEqual(t, byte(msgBatch), m[0])
		}
		enc := encodeBatch(msgs)
		require.LessOrEqual(t, len(enc), len(b), "varints may be overlong on the wire, never in our encoding")
		msgs2, ok := decodeBatch(enc)
		require.True(t, ok)
		require.Equal(t, msgs, msgs2)
	})
}

// batchSeeds are well-formed and malformed overflow lane packets.
func batchSeeds() [][]byte {
	capa := capUpdate{name: "node-1", boot: 7, seq: 9, free: []int64{1 << 30}}.encode()
	good := encodeBatch([][]byte{capa, encodeLeave("node-2", 3)})
	return [][]byte{
		good,
		encodeBatch([][]byte{capa}),
		good[:len(good)-1],                   // truncated in a message
		append(append([]byte{}, good...), 0), // a byte left over
		encodeBatch([][]byte{good}),          // a batch inside a batch
		{msgBatch, 0},                        // no messages
		{msgBatch, 1, 0},                     // an empty message
		{msgBatch, 0xff, 0xff, 0xff, 0xff, 0x0f, 1}, // a count beyond the bytes
	}
}

// capacitySeeds are well-formed and malformed capacity updates.
func capacitySeeds() [][]byte {
	good := capUpdate{name: "node-1", boot: 0x0123456789abcdef, seq: 300, free: []int64{60 << 30, 0, 1 << 40}}.encode()
	return [][]byte{
		good,
		capUpdate{name: "n", boot: 1, seq: 1}.encode(),
		good[:len(good)-3],                              // truncated in a free
		append(append([]byte{}, good...), 1, 2, 3),      // trailing bytes
		append([]byte{msgCapacity}, make([]byte, 9)...), // no name
		{msgCapacity, 0xff},
	}
}

// fuzzSeeds are well-formed, borderline and malformed encodings.
func fuzzSeeds() [][]byte {
	var seeds [][]byte
	add := func(m Meta, boot uint64) {
		b, err := encodeMeta(m, stamp{boot: boot, capSeq: boot >> 1})
		if err != nil {
			panic(err) // a seed bug, not input
		}
		seeds = append(seeds, b)
	}
	add(Meta{}, 1)
	add(testMeta("node-1"), 0x0123456789abcdef)
	add(Meta{Proto: 7, GRPCAddr: "[fd00::1]:7070", DataAddr: "[fd00::1]:7071", Draining: true,
		Tiers: []TierFree{{Name: "rdma", Capacity: 1 << 40, Free: 1 << 39}}}, 2)
	full := Meta{Proto: 1}
	for i := range MaxTiers {
		full.Tiers = append(full.Tiers, TierFree{Name: "tier-" + string(rune('a'+i)), Capacity: 1 << 62, Free: 1 << 61})
	}
	add(full, 3)
	add(Meta{Proto: 1, Draining: true, DrainingSince: 1_733_366_400_000}, 0) // draining since, after a capacity sequence of 0
	add(Meta{Proto: 1, Zone: "rack-1"}, 0)                                   // a zone, after a drain's start of 0
	add(Meta{Proto: 1, Draining: true, DrainingSince: 1_733_366_400_000, Evacuating: true}, 4)
	good := seeds[1]
	seeds = append(seeds,
		good[:len(good)/2],                                      // truncated in a tier
		append([]byte{2}, good[1:]...),                          // a future version
		append(append([]byte{}, good...), 1, 2, 3),              // trailing bytes from a newer writer
		[]byte(`{"proto":1,"grpc":"h:1"}`),                      // JSON from some other program
		header(0, 1, "", "", MaxTiers+1),                        // too many tiers
		append(header(0, 1, "", "", 1), 3, 'c', 'x', 'l', 1, 2), // free above capacity
		[]byte{},
	)
	return seeds
}
