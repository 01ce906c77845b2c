package devices

import (
	"errors"
	"fmt"
	"testing"
)

// FuzzParseEnum checks that ParseEnum never panics, fails only with a
// *SyntaxError, and that what it accepts reads back from its own output.
func FuzzParseEnum(f *testing.F) {
	for _, s := range []string{"4: ACTIVE\n", "7: Phy Test", "1: CA", "ACTIVE", "", ":", "99999999999999999999: X"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, name, err := ParseEnum(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("ParseEnum(%q): %v is not a *SyntaxError", s, err)
			}
			return
		}
		n2, name2, err := ParseEnum(fmt.Sprintf("%d: %s", n, name))
		if err != nil || n2 != n || name2 != name {
			t.Fatalf("ParseEnum(%q) = %d, %q does not read back: %d, %q, %v", s, n, name, n2, name2, err)
		}
	})
}
