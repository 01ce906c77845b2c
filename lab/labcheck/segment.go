package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/size"
)

// pattern is the byte at offset i of a check segment; it depends on the
// segment name so two segments never hold the same bytes.
func pattern(name string, i int) byte {
	h := byte(len(name))
	for _, c := range []byte(name) {
		h = h*31 + c
	}
	return byte(i*7+i>>12) ^ h
}

func dial(ctx context.Context, socket string) (*alloc.Client, error) {
	return alloc.Dial(ctx, socket, alloc.WithClientName("labcheck"))
}

// put allocates a named, persisted segment on a tier, writes the pattern
// through the mapping it received by descriptor passing, and reads it back.
func put(args []string) bool {
	fs := flag.NewFlagSet("put", flag.ExitOnError)
	socket := fs.String("socket", "", "poold socket")
	tier := fs.String("tier", "cxl", "tier")
	name := fs.String("name", "lab", "segment name")
	wantKind := fs.String("want-kind", "", "device kind the segment must land on (devdax, numa)")
	persist := fs.Bool("persist", false, "flush the written bytes with Segment.Persist: the segment must be on power-safe memory")
	var sz size.Size = 8 << 20
	fs.Var(&sz, "size", "segment size")
	fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := dial(ctx, *socket)
	if err != nil {
		return result("put-"+*name, false, "dial %s: %v", *socket, err)
	}
	defer c.Close()
	t, err := alloc.ParseTier(*tier)
	if err != nil {
		return result("put-"+*name, false, "%v", err)
	}
	s, err := c.Alloc(ctx, int64(sz), alloc.WithTier(t), alloc.WithName(*name), alloc.WithPersist())
	if err != nil {
		return result("put-"+*name, false, "alloc %v on %s: %v", sz, *tier, err)
	}
	desc := fmt.Sprintf("segment %d %s on %s (kind %s, emulated %v)", s.ID(), *name, s.Device(), s.Kind(), s.Emulated())
	if *wantKind != "" && s.Kind() != *wantKind {
		return result("put-"+*name, false, "%s: want kind %s", desc, *wantKind)
	}
	b, ok := s.Bytes()
	if !ok {
		return result("put-"+*name, false, "%s: no load/store mapping", desc)
	}
	for i := range b {
		b[i] = pattern(*name, i)
	}
	for i := range b {
		if b[i] != pattern(*name, i) {
			return result("put-"+*name, false, "%s: byte %d reads back %#x", desc, i, b[i])
		}
	}
	if *persist {
		d := s.Durability()
		if err := s.Persist(0, s.Size()); err != nil {
			result("persist-"+*name, false, "%s: %v", desc, err)
		} else {
			result("persist-"+*name, true, "%s: power-safe %v, %s: %s", desc, d.PowerSafe, d.Method, d.Reason)
		}
	}
	return result("put-"+*name, true, "%s: %d bytes written by load/store through the passed descriptor", desc, len(b))
}

// get attaches a named segment and checks the pattern put wrote.
func get(args []string) bool {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	socket := fs.String("socket", "", "poold socket")
	name := fs.String("name", "lab", "segment name")
	check := fs.String("check", "get", "name of the check to print")
	fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := dial(ctx, *socket)
	if err != nil {
		return result(*check, false, "dial %s: %v", *socket, err)
	}
	defer c.Close()
	s, err := c.Attach(ctx, *name)
	if err != nil {
		return result(*check, false, "attach %s: %v", *name, err)
	}
	b, ok := s.Bytes()
	if !ok {
		return result(*check, false, "segment %s: no load/store mapping", *name)
	}
	for i := range b {
		if b[i] != pattern(*name, i) {
			return result(*check, false, "segment %d %s on %s: byte %d is %#x, want %#x", s.ID(), *name, s.Device(), i, b[i], pattern(*name, i))
		}
	}
	return result(*check, true, "segment %d %s on %s: all %d bytes intact", s.ID(), *name, s.Device(), len(b))
}
