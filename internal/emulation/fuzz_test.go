package emulation

import (
	"errors"
	"testing"
)

// FuzzParse checks that Parse never panics, that every error is a
// *SyntaxError saying what to write instead, and that what it accepts
// round-trips through String.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"cxl=200ns,rdma=2us/12GB/s", "cxl=200", "rdma=2us/100Gb/s", "none", ",", "local=1.5us/1.5GB/s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := Parse(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Reason == "" {
				t.Fatalf("Parse(%q): %v is not a *SyntaxError with a reason", s, err)
			}
			return
		}
		back, err := Parse(sp.String())
		if err != nil || back != sp {
			t.Fatalf("Parse(%q).String() = %q does not read back: %v, %v", s, sp.String(), back, err)
		}
	})
}
