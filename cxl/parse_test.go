package cxl

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireMalformed checks err is an *AttrError matching ErrMalformed.
func requireMalformed(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, ErrMalformed)
	var ae *AttrError
	require.ErrorAs(t, err, &ae)
	require.NotEmpty(t, ae.Reason)
}

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "0-3,8,10-11\n", want: []int{0, 1, 2, 3, 8, 10, 11}},
		{in: "0", want: []int{0}},
		{in: "", want: nil},
		{in: "\n", want: nil},
		{in: "5,1-2", want: []int{1, 2, 5}},
		{in: "0-3,2-5", want: []int{0, 1, 2, 3, 4, 5}},
		{in: "65535", want: []int{65535}},
		{in: "3-1", bad: true},
		{in: "0,,1", bad: true},
		{in: "0,", bad: true},
		{in: "-1", bad: true},
		{in: "1-", bad: true},
		{in: "+1", bad: true},
		{in: "0x1", bad: true},
		{in: "1 2", bad: true},
		{in: "0-4294967295", bad: true},
		{in: "65536", bad: true},
		{in: "1-2-3", bad: true},
		{in: "a", bad: true},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.in), func(t *testing.T) {
			got, err := ParseCPUList(tt.in)
			if tt.bad {
				requireMalformed(t, err)
				require.Nil(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		bad  bool
	}{
		{in: "0x10000000\n", want: 0x10000000},
		{in: "0X1f", want: 0x1f},
		{in: "268435456", want: 268435456},
		{in: "0", want: 0},
		{in: "0x0", want: 0},
		{in: "0xffffffffffffffff", want: 1<<64 - 1},
		{in: "18446744073709551615", want: 1<<64 - 1},
		{in: "18446744073709551616", bad: true},
		{in: "0x10000000000000000", bad: true},
		{in: "", bad: true},
		{in: "0x", bad: true},
		{in: "-1", bad: true},
		{in: "+1", bad: true},
		{in: "1_000", bad: true},
		{in: "0x_1", bad: true},
		{in: "zz", bad: true},
		{in: "4K", bad: true},
		{in: "1 2", bad: true},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.in), func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if tt.bad {
				requireMalformed(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseDistance(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "10 20\n", want: []int{10, 20}},
		{in: "10", want: []int{10}},
		{in: "10  21   31", want: []int{10, 21, 31}},
		{in: "255 0", want: []int{255, 0}},
		{in: "", bad: true},
		{in: "10 x", bad: true},
		{in: "256", bad: true},
		{in: "-10", bad: true},
		{in: "10,20", bad: true},
	}
	for _, tt := range tests {
		t.Run(strconv.Quote(tt.in), func(t *testing.T) {
			got, err := ParseDistance(tt.in)
			if tt.bad {
				requireMalformed(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Meminfo
		bad  bool
	}{
		{
			name: "kernel",
			in: "Node 0 MemTotal:        3892984 kB\nNode 0 MemFree:         3432616 kB\n" +
				"Node 0 Active(anon):       1540 kB\nNode 0 HugePages_Total:     0\n",
			want: Meminfo{Node: 0, Fields: map[string]uint64{
				"MemTotal": 3892984 * 1024, "MemFree": 3432616 * 1024,
				"Active(anon)": 1540 * 1024, "HugePages_Total": 0,
			}},
		},
		{name: "brief", in: "Node 0 MemTotal:  16384 kB", want: Meminfo{Node: 0, Fields: map[string]uint64{"MemTotal": 16384 * 1024}}},
		{name: "blank lines", in: "\nNode 12 MemFree: 1 kB\n\n", want: Meminfo{Node: 12, Fields: map[string]uint64{"MemFree": 1024}}},
		{name: "empty", in: "", bad: true},
		{name: "only blanks", in: "\n \n", bad: true},
		{name: "no Node", in: "MemTotal: 1 kB", bad: true},
		{name: "two nodes", in: "Node 0 MemTotal: 1 kB\nNode 1 MemFree: 1 kB", bad: true},
		{name: "duplicate key", in: "Node 0 MemTotal: 1 kB\nNode 0 MemTotal: 2 kB", bad: true},
		{name: "no colon", in: "Node 0 MemTotal 1 kB", bad: true},
		{name: "empty key", in: "Node 0 : 1 kB", bad: true},
		{name: "unit", in: "Node 0 MemTotal: 1 MB", bad: true},
		{name: "value", in: "Node 0 MemTotal: lots kB", bad: true},
		{name: "negative", in: "Node 0 MemTotal: -1 kB", bad: true},
		{name: "node", in: "Node x MemTotal: 1 kB", bad: true},
		{name: "overflow", in: "Node 0 MemTotal: 18446744073709551615 kB", bad: true},
		{name: "extra field", in: "Node 0 MemTotal: 1 kB x", bad: true},
		{name: "short", in: "Node 0 MemTotal:", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMeminfo(tt.in)
			if tt.bad {
				requireMalformed(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestAttrErrorMessage(t *testing.T) {
	e := &AttrError{Path: "/sys/bus/cxl/devices/mem0/ram/size", Value: "zz", Reason: "want a byte count", Err: ErrMalformed}
	msg := e.Error()
	for _, part := range []string{"/sys/bus/cxl/devices/mem0/ram/size", `"zz"`, "want a byte count", "copy the file again"} {
		require.Contains(t, msg, part)
	}
	_, err := ParseSize(strings.Repeat("9", 500))
	var ae *AttrError
	require.ErrorAs(t, err, &ae)
	require.LessOrEqual(t, len(ae.Value), maxValueInError+3, "values in errors are clipped")
}
