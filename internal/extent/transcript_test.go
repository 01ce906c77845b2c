package extent

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTranscripts replays every testdata/*.txt transcript. A transcript is
// a list of commands, one a line; '#' starts a comment:
//
//	new CAPACITY ALIGN           start a fresh allocator
//	alloc LENGTH -> OFFSET       Alloc must return OFFSET
//	alloc LENGTH -> ErrNoSpace   Alloc must fail with that sentinel
//	free OFFSET LENGTH           Free must succeed
//	free OFFSET LENGTH -> ERR    Free must fail with sentinel ERR
//	reserve OFFSET LENGTH [-> ERR]
//	stats key=value ...          each given Stats field must match: used,
//	                             free, largest, extents, allocated, capacity,
//	                             frag (to within 0.0005)
//
// Numbers are Go integer literals (4096, 0x1000, 1_048_576). After every
// command the allocator's invariants are checked.
func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no transcripts in testdata")
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			replay(t, file)
		})
	}
}

func replay(t *testing.T, file string) {
	f, err := os.Open(file)
	require.NoError(t, err)
	defer f.Close()

	var a *Allocator
	sc := bufio.NewScanner(f)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		where := fmt.Sprintf("%s:%d: %s", file, lineNo, line)
		cmd, want, hasWant := strings.Cut(line, "->")
		want = strings.TrimSpace(want)
		fields := strings.Fields(cmd)
		num := func(i int) int64 {
			require.Greater(t, len(fields), i, "%s: missing argument %d", where, i)
			n, err := strconv.ParseInt(fields[i], 0, 64)
			require.NoError(t, err, where)
			return n
		}
		if fields[0] != "new" {
			require.NotNil(t, a, "%s: command before 'new'", where)
		}
		// checkErr checks err against the expected result when it names an
		// error, and returns whether the command was expected to succeed.
		checkErr := func(err error) bool {
			if hasWant && strings.HasPrefix(want, "Err") {
				require.Error(t, err, where)
				require.Equal(t, want, errName(err), "%s: %v", where, err)
				return false
			}
			require.NoError(t, err, where)
			return true
		}
		switch fields[0] {
		case "new":
			a, err = New(num(1), num(2))
			if checkErr(err) {
				checkInvariants(t, a, nil)
			}
			continue
		case "alloc":
			require.Len(t, fields, 2, where)
			require.True(t, hasWant, "%s: alloc needs '-> OFFSET' or '-> ErrX'", where)
			off, err := a.Alloc(num(1))
			if checkErr(err) {
				wantOff, perr := strconv.ParseInt(want, 0, 64)
				require.NoError(t, perr, where)
				require.Equal(t, wantOff, off, where)
			}
		case "free":
			require.Len(t, fields, 3, where)
			checkErr(a.Free(num(1), num(2)))
		case "reserve":
			require.Len(t, fields, 3, where)
			checkErr(a.Reserve(num(1), num(2)))
		case "stats":
			checkStats(t, where, a.Stats(), fields[1:])
		default:
			require.Failf(t, "unknown command", "%s", where)
		}
		checkInvariants(t, a, nil)
	}
	require.NoError(t, sc.Err())
}

func checkStats(t *testing.T, where string, st Stats, kvs []string) {
	require.NotEmpty(t, kvs, "%s: stats needs key=value pairs", where)
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, "%s: %q is not key=value", where, kv)
		if k == "frag" {
			want, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, where)
			require.InDelta(t, want, st.Fragmentation, 0.0005, "%s: frag", where)
			continue
		}
		want, err := strconv.ParseInt(v, 0, 64)
		require.NoError(t, err, where)
		var got int64
		switch k {
		case "capacity":
			got = st.Capacity
		case "used":
			got = st.Used
		case "free":
			got = st.Free
		case "largest":
			got = st.LargestFree
		case "extents":
			got = int64(st.FreeExtents)
		case "allocated":
			got = int64(st.Allocated)
		default:
			require.Failf(t, "unknown stats key", "%s: %q", where, k)
		}
		require.Equal(t, want, got, "%s: %s (stats %+v)", where, k, st)
	}
}
