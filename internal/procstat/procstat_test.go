package procstat

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParse: the fields count from the last ')', whatever the command
// name holds; a line without a name in parentheses, or nothing after it,
// is ErrMalformed.
func TestParse(t *testing.T) {
	f, err := Parse([]byte("4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 123456 1000 10\n"))
	require.NoError(t, err)
	require.Equal(t, "S", f[0])
	require.Equal(t, "7", f[14-3], "utime, field 14")
	require.Equal(t, "123456", f[22-3], "starttime, field 22")
	for _, bad := range []string{"", "4242 name S 1", "4242 (name)", "4242 (name)  \n", "4242 name) S 1"} {
		_, err := Parse([]byte(bad))
		require.ErrorIs(t, err, ErrMalformed, "%q", bad)
	}
}

// TestFields reads this process's own line, and a pid that no process
// has.
func TestFields(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here:", err)
	}
	f, err := Fields(os.Getpid())
	require.NoError(t, err)
	require.True(t, strings.ContainsAny(f[0], "RS"), "this process runs: state %q", f[0])
	_, err = Fields(1 << 30) // above pid_max
	require.True(t, errors.Is(err, fs.ErrNotExist), "%v", err)
}

// FuzzParse: any line parses to fields or fails with ErrMalformed, never a
// panic; the fields never hold a space.
func FuzzParse(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 2 0 0\n"))
	f.Add([]byte("7 (a) b) Z 1"))
	f.Add([]byte(")("))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		fields, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse(%q): %v is not ErrMalformed", b, err)
			}
			return
		}
		if len(fields) == 0 {
			t.Fatalf("Parse(%q): no fields and no error", b)
		}
		for _, x := range fields {
			if x == "" || strings.ContainsAny(x, " \t\n") {
				t.Fatalf("Parse(%q): field %q", b, x)
			}
		}
	})
}
