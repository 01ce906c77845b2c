package pool

import (
	"errors"
	"slices"
	"testing"

	"github.com/farmem/farmem/internal/errs"
)

// FuzzDecodeMapped: a stored entry of who maps a devdax segment either
// decodes to one that encodes and decodes back to itself, or fails with an
// error matching ErrInvalid (corrupt) or ErrNotSupported (a newer form);
// never a panic, nor a count of mappers that allocates past the input.
func FuzzDecodeMapped(f *testing.F) {
	for _, e := range []mappedEntry{
		{device: "dax0.0", offset: 0, extent: 2 << 20, by: []mapper{{client: "app", pid: 4242, start: 123456}}},
		{device: "dax1.0", offset: 1 << 40, extent: 1 << 30, by: []mapper{{client: "a"}, {client: "b", pid: 1<<31 - 1, start: 1<<64 - 1}}},
		{device: "dax0.0", offset: 4096, extent: 4096},
	} {
		f.Add(encodeMapped(e))
	}
	f.Add([]byte{})
	f.Add([]byte{2})
	f.Add([]byte{1, 6, 'd', 'a', 'x', '0', '.', '0', 0, 2, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeMapped(b)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalid) && !errors.Is(err, errs.ErrNotSupported) {
				t.Fatalf("decodeMapped(%x): %v matches neither ErrInvalid nor ErrNotSupported", b, err)
			}
			return
		}
		back, err := decodeMapped(encodeMapped(e))
		if err != nil || back.device != e.device || back.offset != e.offset || back.extent != e.extent || !slices.Equal(back.by, e.by) {
			t.Fatalf("decodeMapped(%x) = %+v, which encodes to one decoding to %+v, %v", b, e, back, err)
		}
	})
}
