package size

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Size
		bad  bool
	}{
		{in: "4096", want: 4096},
		{in: "64MiB", want: 64 << 20},
		{in: "64mib", want: 64 << 20},
		{in: "1G", want: 1 << 30},
		{in: "1GB", want: 1e9},
		{in: "1.5GiB", want: 3 << 29},
		{in: " 2 KiB ", want: 2048},
		{in: "0", want: 0},
		{in: "", bad: true},
		{in: "-1", bad: true},
		{in: "GiB", bad: true},
		{in: "12XB", bad: true},
		{in: "99999999999TiB", bad: true},
		{in: "1e3", bad: true},
		{in: "1..2G", bad: true},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := Parse(c.in)
			if c.bad {
				require.ErrorIs(t, err, ErrSyntax)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestStringRoundTrip(t *testing.T) {
	for _, s := range []Size{0, 1, 1023, KiB, 1536 * KiB, 64 * MiB, 3 * GiB, 2 * TiB, 1<<40 + 1} {
		back, err := Parse(s.String())
		require.NoError(t, err)
		require.Equal(t, s, back, s.String())
	}
	require.Equal(t, "1.5 GiB", (GiB + GiB/2).Human())
	require.Equal(t, "100 B", Size(100).Human())
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"4096", "64MiB", "1.5G", "", "x", "9223372036854775807", "1e9GiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err == nil && n < 0 {
			t.Fatalf("Parse(%q) = %d, negative", s, n)
		}
	})
}
