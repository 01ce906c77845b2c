package pool

import (
	"errors"
	"testing"

	"github.com/farmem/farmem/internal/errs"
)

// FuzzPageToken: a page_token from a client either parses to a token whose
// text parses back to itself, or fails with ErrInvalid; never a panic.
func FuzzPageToken(f *testing.F) {
	for _, s := range []string{"", "node-a/42", "a/b/7", "/0", "node/", "node/18446744073709551616", "node/-1", "\xff/1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := parsePageToken(s)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) {
				t.Fatalf("parsePageToken(%q): %v does not match ErrInvalid", s, err)
			}
			return
		}
		if s == "" {
			return
		}
		back, err := parsePageToken(tok.String())
		if err != nil || back != tok {
			t.Fatalf("parsePageToken(%q) = %+v, whose text %q parses to %+v, %v", s, tok, tok.String(), back, err)
		}
	})
}
