package probe

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

func TestLoadChain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		span    int
		samples int
	}{
		{"two lines", 2 * LineSize, 5},
		{"1 MiB", 1 << 20, 100},
		{"odd tail", 4096 + 17, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []func([]byte, int) (Result, error){LoadChain, StoreChain} {
				r, err := f(make([]byte, tc.span), tc.samples)
				require.NoError(t, err)
				require.Equal(t, tc.samples, r.Samples)
				require.Positive(t, r.P50)
				require.GreaterOrEqual(t, r.P99, r.P50)
			}
		})
	}
}

func TestLoadChainIsOneCycle(t *testing.T) {
	mem := make([]byte, 1000*LineSize)
	_, err := LoadChain(mem, 1)
	require.NoError(t, err)
	seen := make([]bool, 1000)
	idx := uint64(0)
	for range 1000 {
		require.False(t, seen[idx], "line %d visited twice before the chain closed", idx)
		seen[idx] = true
		idx = uint64(mem[idx*LineSize]) | uint64(mem[idx*LineSize+1])<<8
	}
	require.Zero(t, idx, "the chain does not return to its start")
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func() error
	}{
		{"chain one line", func() error { _, err := LoadChain(make([]byte, LineSize), 1); return err }},
		{"chain no samples", func() error { _, err := LoadChain(make([]byte, 4096), 0); return err }},
		{"read empty", func() error { _, err := SeqRead(nil); return err }},
		{"write empty", func() error { _, err := SeqWrite(nil); return err }},
		{"remote small", func() error { _, err := RemoteRead(t.Context(), nil, rdma.Region{}, 100, 1, false); return err }},
		{"remote no samples", func() error { _, err := RemoteRead(t.Context(), nil, rdma.Region{}, 1<<20, 0, false); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.f(), ErrSpan)
		})
	}
}

func TestSeqBandwidth(t *testing.T) {
	mem := make([]byte, 1<<20)
	r, err := SeqRead(mem)
	require.NoError(t, err)
	require.Positive(t, r)
	w, err := SeqWrite(mem)
	require.NoError(t, err)
	require.Positive(t, w)
}
