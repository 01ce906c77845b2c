package alloc

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStreamObserve runs the detector over transcripts of accesses: which
// of them continue a stream that is read ahead.
func TestStreamObserve(t *testing.T) {
	const k = 4096
	for _, tc := range []struct {
		name string
		offs []int64 // each access is k bytes
		want []bool
	}{
		{"sequential from the start", []int64{0, k, 2 * k, 3 * k}, []bool{false, true, true, true}},
		{"sequential from the middle", []int64{10 * k, 11 * k, 12 * k, 13 * k}, []bool{false, false, true, true}},
		{"stride", []int64{0, 4 * k, 8 * k, 12 * k, 16 * k}, []bool{false, false, false, true, true}},
		{"backward", []int64{9 * k, 8 * k, 7 * k, 6 * k}, []bool{false, false, false, true}},
		{"random", []int64{7 * k, 3 * k, 90 * k, 12 * k, 40 * k}, []bool{false, false, false, false, false}},
		{"a jump ends the stream", []int64{0, k, 2 * k, 50 * k, 51 * k, 52 * k}, []bool{false, true, true, false, false, true}},
		{"rereading one place is no stream", []int64{5 * k, 5 * k, 5 * k, 5 * k}, []bool{false, false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st stream
			for i, off := range tc.offs {
				require.Equal(t, tc.want[i], st.observe(off, k), "access %d at %d", i, off)
			}
		})
	}
}
