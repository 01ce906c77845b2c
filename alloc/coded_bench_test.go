package alloc_test

import (
	"testing"

	"github.com/klauspost/reedsolomon"
	"github.com/stretchr/testify/require"
)

// BenchmarkErasureEncode is the Reed–Solomon work behind an
// ErasureCoded(4, 2) segment on one core (reedsolomon.New(4, 2), default
// options, as the homes use it): "stripe" computes both parity chunks of a
// whole stripe (4 data chunks of 4 KiB), "delta" the parity updates of one
// 4 KiB write (EncodeIdx of old XOR new, what a data home sends its parity
// homes). MB/s counts data bytes.
//
//	go test -run '^$' -bench ErasureEncode -cpu 1 ./alloc
func BenchmarkErasureEncode(b *testing.B) {
	const k, m, chunk = 4, 2, 4096
	enc, err := reedsolomon.New(k, m)
	require.NoError(b, err)
	shards := make([][]byte, k+m)
	for i := range shards {
		shards[i] = make([]byte, chunk)
		for j := range shards[i] {
			shards[i][j] = byte(i*31 + j)
		}
	}
	b.Run("stripe", func(b *testing.B) {
		b.SetBytes(k * chunk)
		for b.Loop() {
			if err := enc.Encode(shards); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("delta", func(b *testing.B) {
		b.SetBytes(chunk)
		for i := 0; b.Loop(); i++ {
			clear(shards[k])
			clear(shards[k+1])
			if err := enc.EncodeIdx(shards[i%k], i%k, shards[k:]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
