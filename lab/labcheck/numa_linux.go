package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/size"
)

// numa allocates a cxl-tier segment (poold must place it on the
// memory-only node), touches every page through the passed descriptor and
// asks the kernel (move_pages with no target nodes) where each page is.
func numa(args []string) bool {
	fs := flag.NewFlagSet("numa", flag.ExitOnError)
	socket := fs.String("socket", "", "poold socket")
	node := fs.Int("node", 1, "the memory-only NUMA node the pages must be on")
	var sz size.Size = 8 << 20
	fs.Var(&sz, "size", "segment size")
	check := fs.String("check", "numa-pages", "name of the result line")
	fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := dial(ctx, *socket)
	if err != nil {
		return result(*check, false, "dial %s: %v", *socket, err)
	}
	defer c.Close()
	s, err := c.Alloc(ctx, int64(sz), alloc.WithTier(alloc.TierCXL))
	if err != nil {
		return result(*check, false, "alloc %v on cxl: %v", sz, err)
	}
	defer s.Free(ctx)
	desc := fmt.Sprintf("segment %d on %s (kind %s)", s.ID(), s.Device(), s.Kind())
	b, ok := s.Bytes()
	if !ok {
		return result(*check, false, "%s: no load/store mapping", desc)
	}
	pg := os.Getpagesize()
	for i := 0; i < len(b); i += pg {
		b[i] = byte(i)
	}
	npages := len(b) / pg
	pages := make([]uintptr, npages)
	status := make([]int32, npages)
	base := uintptr(unsafe.Pointer(&b[0]))
	for i := range pages {
		pages[i] = base + uintptr(i*pg)
	}
	_, _, e := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, uintptr(npages), uintptr(unsafe.Pointer(&pages[0])), 0, uintptr(unsafe.Pointer(&status[0])), 0)
	if e != 0 {
		return result(*check, false, "%s: move_pages: %v", desc, e)
	}
	count := map[int32]int{}
	for _, st := range status {
		count[st]++
	}
	fmt.Printf("numa_maps: %s\n", numaMaps(base))
	return result(*check, count[int32(*node)] == npages, "%s: %d of %d pages on node %d (move_pages: node->pages %v)", desc, count[int32(*node)], npages, *node, count)
}

// numaMaps returns this process's /proc/self/numa_maps line for the mapping
// at addr.
func numaMaps(addr uintptr) string {
	f, err := os.Open("/proc/self/numa_maps")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	want := fmt.Sprintf("%x ", addr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), want) {
			return sc.Text()
		}
	}
	return "no line for " + want
}
