package cxl

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Seeds beyond the committed corpus in testdata/fuzz/<FuzzName>/ are added
// here so a plain 'go test' runs them too.

// requireParseError checks a rejected input came back as a typed error.
func requireParseError(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, ErrMalformed)
	var ae *AttrError
	require.ErrorAs(t, err, &ae)
	require.LessOrEqual(t, len(ae.Value), maxValueInError+3)
}

// formatList renders ids in the kernel's "%*pbl" form, for round trips.
func formatList(ids []int) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ids[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(ids[j]))
		}
		i = j + 1
	}
	return b.String()
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8,10-11", "", "\n", "0", "3-1", "0,,1", "65535", "0-65535", "1-2-3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := ParseCPUList(s)
		if err != nil {
			requireParseError(t, err)
			return
		}
		for i, id := range ids {
			// Plain checks: require per element is slow on 65536 ids.
			if id < 0 || id > MaxListID || (i > 0 && id <= ids[i-1]) {
				t.Fatalf("ParseCPUList(%q)[%d] = %d: want ids in [0, %d], sorted and unique", s, i, id, MaxListID)
			}
		}
		again, err := ParseCPUList(formatList(ids))
		require.NoError(t, err)
		require.Equal(t, ids, again)
	})
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"0x10000000", "268435456", "0", "0x", "-1", "0xffffffffffffffff", "18446744073709551616", " 42\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			requireParseError(t, err)
			return
		}
		for _, form := range []string{strconv.FormatUint(v, 10), fmt.Sprintf("%#x", v)} {
			again, err := ParseSize(form)
			require.NoError(t, err)
			require.Equal(t, v, again)
		}
	})
}

func FuzzParseMeminfo(f *testing.F) {
	for _, s := range []string{
		"Node 0 MemTotal:        3892984 kB\nNode 0 MemFree:         3432616 kB\nNode 0 HugePages_Total:     0\n",
		"Node 0 MemTotal:  16384 kB",
		"Node 1 MemTotal: 1 kB\nNode 0 MemFree: 1 kB\n",
		"Node 0 MemTotal: 18014398509481984 kB",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMeminfo(s)
		if err != nil {
			requireParseError(t, err)
			return
		}
		require.GreaterOrEqual(t, m.Node, 0)
		require.NotEmpty(t, m.Fields)
		// Render canonically, values in bytes without a unit, and read back.
		keys := make([]string, 0, len(m.Fields))
		for k := range m.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "Node %d %s: %d\n", m.Node, k, m.Fields[k])
		}
		again, err := ParseMeminfo(b.String())
		require.NoError(t, err)
		require.Equal(t, m, again)
	})
}

func FuzzParseDistance(f *testing.F) {
	for _, s := range []string{"10 20", "10", "", "256", "10 x", "10\t21\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDistance(s)
		if err != nil {
			requireParseError(t, err)
			return
		}
		require.NotEmpty(t, d)
		parts := make([]string, len(d))
		for i, v := range d {
			require.GreaterOrEqual(t, v, 0)
			require.LessOrEqual(t, v, maxDistance)
			parts[i] = strconv.Itoa(v)
		}
		again, err := ParseDistance(strings.Join(parts, " "))
		require.NoError(t, err)
		require.Equal(t, d, again)
	})
}
