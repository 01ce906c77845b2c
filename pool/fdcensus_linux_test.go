package pool

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fdCensus counts this process's descriptors by kind: TCP sockets by the
// plane they belong to (control: gRPC; data: the data plane) and by side
// (the dialer's or the server's end), unix sockets, and files, read from
// /proc/self/fd and /proc/self/net; and, from the daemons' own tables,
// the connections the product says it holds, so that a gap between the
// two (a connection nobody tracks) shows. The scale simulation logs it at
// each phase: one process holds every host's descriptors, and its
// RLIMIT_NOFILE bounds how many hosts may run applications.
type fdCensus struct {
	kinds map[string]int
	total int
	// What the daemons' tables hold: peer sessions (peers.conns), shared
	// forwarding links (forwards.links) and push lanes (pushers).
	sessions, links, lanes int
}

func (c fdCensus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d descriptors; tables: %d peer sessions, %d forwarding links, %d push lanes\n", c.total, c.sessions, c.links, c.lanes)
	b.WriteString(kindLines(c.kinds, 20))
	return b.String()
}

// census takes an fdCensus of this process and sc's running hosts.
func (sc *simCluster) census() fdCensus {
	c := fdCensus{kinds: map[string]int{}}
	ports := map[int]string{} // server port -> "control" or "data"
	for _, h := range sc.up() {
		d := h.daemon()
		if d == nil {
			continue // crashed meanwhile
		}
		if p := addrPort(d.ListenAddr()); p > 0 {
			ports[p] = "control"
		}
		if d.pool.dp != nil {
			if p := addrPort(d.pool.dp.addr); p > 0 {
				ports[p] = "data"
			}
		}
		ps := d.pool.peers
		ps.mu.Lock()
		c.sessions += len(ps.conns)
		ps.mu.Unlock()
		d.pool.fwd.mu.Lock()
		c.links += len(d.pool.fwd.links)
		d.pool.fwd.mu.Unlock()
		d.pool.pushing.mu.Lock()
		for _, pu := range d.pool.pushing.m {
			c.lanes += len(pu.conns)
		}
		for _, spare := range d.pool.pushing.spare {
			c.lanes += len(spare)
		}
		d.pool.pushing.mu.Unlock()
	}
	tcp := map[string]string{} // socket inode -> kind
	for _, f := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		readProcNet(f, func(fields []string) {
			if len(fields) < 10 {
				return
			}
			local, remote := hexPort(fields[1]), hexPort(fields[2])
			kind := "tcp, other"
			switch {
			case fields[3] == "0A":
				kind = "tcp listener"
			case ports[local] != "":
				kind = "tcp " + ports[local] + " plane, server end"
			case ports[remote] != "":
				kind = "tcp " + ports[remote] + " plane, dialer end"
			}
			tcp[fields[9]] = kind
		})
	}
	unix := map[string]bool{}
	readProcNet("/proc/self/net/unix", func(fields []string) {
		if len(fields) >= 7 {
			unix[fields[6]] = true
		}
	})
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		c.kinds["unreadable: "+err.Error()]++
		return c
	}
	for _, e := range es {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		c.total++
		switch {
		case strings.HasPrefix(target, "socket:["):
			ino := strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")
			switch {
			case tcp[ino] != "":
				c.kinds[tcp[ino]]++
			case unix[ino]:
				c.kinds["unix socket"]++
			default:
				c.kinds["socket, other"]++
			}
		case strings.HasPrefix(target, sc.root):
			rel, _ := filepath.Rel(sc.root, target)
			parts := strings.Split(rel, string(filepath.Separator))
			kind := "file under a host's directory"
			if len(parts) > 1 {
				kind = "file under a host's " + parts[1]
			}
			c.kinds[kind]++
		default:
			if i := strings.IndexAny(target, ":["); i > 0 {
				target = target[:i]
			}
			c.kinds[target]++
		}
	}
	return c
}

func addrPort(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// hexPort is the port of a /proc/net/tcp address ("0100007F:1F90").
func hexPort(a string) int {
	i := strings.LastIndexByte(a, ':')
	n, _ := strconv.ParseInt(a[i+1:], 16, 32)
	return int(n)
}

// readProcNet calls fn with the fields of each line of a /proc/net table
// but its header.
func readProcNet(path string, fn func([]string)) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan() // header
	for s.Scan() {
		fn(strings.Fields(s.Text()))
	}
}

// fdWatch takes a census of sc every period and keeps the one with the
// most descriptors, and the last phase logged before it.
type fdWatch struct {
	sc    *simCluster
	done  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	phase string
	peak  fdCensus
	at    string // the phase of the peak
}

// watchDescriptors starts an fdWatch of sc.
func (sc *simCluster) watchDescriptors(period time.Duration) *fdWatch {
	w := &fdWatch{sc: sc, done: make(chan struct{}), phase: "the start"}
	w.wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-t.C:
				w.sample()
			}
		}
	})
	return w
}

func (w *fdWatch) sample() fdCensus {
	c := w.sc.census()
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.total > w.peak.total {
		w.peak, w.at = c, "after "+w.phase
	}
	return c
}

// log logs a census now, and the peak since the last one, under phase.
func (w *fdWatch) log(t testing.TB, phase string) {
	c := w.sample()
	w.mu.Lock()
	peak, at := w.peak, w.at
	w.phase = phase
	w.mu.Unlock()
	t.Logf("descriptors %s (membership events dropped so far: %d): %s", phase, w.sc.eventsDropped(), c)
	if peak.total > c.total {
		t.Logf("descriptors at their peak so far (%s): %s", at, peak)
	}
}

// max is the largest count of descriptors a census found.
func (w *fdWatch) max() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak.total
}

func (w *fdWatch) stop() {
	close(w.done)
	w.wg.Wait()
}

// eventsDropped sums the membership events the running hosts' cluster
// subscriptions dropped because the daemon had not taken them in time.
func (sc *simCluster) eventsDropped() uint64 {
	var n uint64
	for _, h := range sc.up() {
		if d := h.daemon(); d != nil {
			n += d.pool.cl.Stats().EventsDropped
		}
	}
	return n
}
