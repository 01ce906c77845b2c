package coherence

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var randomSteps = flag.Int("coherence.steps", 4000, "steps per seed of TestRandomInterleavings")

// envelope is a message in flight in the simulated network.
type envelope struct {
	toHome bool
	node   int     // the sending (toHome) or receiving cache
	msg    Message // the request, reply or push
	req    *Message
	sentAt time.Time // when the request was first sent
}

// sim drives one Directory and several Caches over a network that reorders,
// drops and duplicates messages, with time advanced by hand.
type sim struct {
	t      *testing.T
	rng    *rand.Rand
	cfg    Config
	now    time.Time
	mem    []byte
	dir    *Directory
	caches []*Cache
	net    []envelope
	rpcs   [][]envelope // per cache: requests not yet answered
	log    []string
	drop   float64
	dup    float64
	values uint64
}

func newSim(t *testing.T, seed uint64, nodes, pages int, drop, dup float64) *sim {
	cfg := Config{PageSize: 512, Lease: 100 * time.Millisecond}
	s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), cfg: cfg, now: time.Unix(1000, 0),
		mem: make([]byte, pages*cfg.PageSize), drop: drop, dup: dup}
	var err error
	s.dir, err = NewDirectory(cfg, s.mem, 7, s.now)
	require.NoError(t, err)
	for i := range nodes {
		c, err := NewCache(cfg, SharerID(i+1), int64(len(s.mem)))
		require.NoError(t, err)
		s.caches = append(s.caches, c)
	}
	s.rpcs = make([][]envelope, nodes)
	return s
}

func (s *sim) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf("%s ", s.now.Sub(time.Unix(1000, 0)))+fmt.Sprintf(format, args...))
}

// send puts a request from cache i on the network and remembers it until
// its reply arrives.
func (s *sim) send(i int, m Message) {
	e := envelope{toHome: true, node: i, msg: m, sentAt: s.now}
	s.net = append(s.net, e)
	s.rpcs[i] = append(s.rpcs[i], e)
	s.logf("cache %d sends %s", i, m)
}

// home delivers a request to the directory and checks every grant it emits.
func (s *sim) home(e envelope) {
	rep, out := s.dir.Handle(s.now, e.msg)
	s.logf("home gets %s from %d, replies %s, pushes %v", e.msg, e.node, rep, out)
	req := e.msg
	s.checkGrant(rep)
	s.net = append(s.net, envelope{node: e.node, msg: rep, req: &req, sentAt: e.sentAt})
	s.push(out)
}

func (s *sim) push(out []Message) {
	for _, m := range out {
		s.checkGrant(m)
		s.net = append(s.net, envelope{node: int(m.From) - 1, msg: m})
	}
}

// checkGrant: when the home grants, no other sharer may hold a conflicting
// copy under an unexpired lease at that instant.
func (s *sim) checkGrant(m Message) {
	if m.Kind != Grant {
		return
	}
	for j, c := range s.caches {
		if SharerID(j+1) == m.From {
			continue
		}
		st := c.State(s.now, m.Page)
		if st == Modified || (m.Exclusive && st == Shared) {
			s.fail("home grants %s while cache %d holds page %d %s until %s", m, j, m.Page, st, c.Expiry(m.Page).Sub(time.Unix(1000, 0)))
		}
	}
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	tail := s.log[max(0, len(s.log)-40):]
	s.t.Fatalf("%s\nlast events:\n%s", fmt.Sprintf(format, args...), strings.Join(tail, "\n"))
}

// deliver takes one envelope off the network: drops it, duplicates it or
// hands it over.
func (s *sim) deliver() {
	if len(s.net) == 0 {
		return
	}
	k := s.rng.IntN(len(s.net))
	e := s.net[k]
	r := s.rng.Float64()
	switch {
	case r < s.drop:
		s.net = slices.Delete(s.net, k, k+1)
		s.logf("drop %s (node %d)", e.msg, e.node)
		return
	case r < s.drop+s.dup:
		s.logf("duplicate %s (node %d)", e.msg, e.node)
	default:
		s.net = slices.Delete(s.net, k, k+1)
	}
	if e.toHome {
		s.home(e)
		return
	}
	c := s.caches[e.node]
	if e.req != nil {
		s.rpcs[e.node] = slices.DeleteFunc(s.rpcs[e.node], func(x envelope) bool {
			return x.msg.Kind == e.req.Kind && x.msg.Seq == e.req.Seq && x.msg.WBSeq == e.req.WBSeq && x.msg.InvID == e.req.InvID && x.msg.Page == e.req.Page && x.sentAt == e.sentAt
		})
		if err := c.Reply(s.now, e.sentAt, *e.req, e.msg); err != nil {
			s.logf("cache %d: reply %s: %v", e.node, e.msg, err)
		}
		return
	}
	out, err := c.Push(s.now, e.msg)
	require.NoError(s.t, err)
	s.logf("cache %d gets push %s, answers %v", e.node, e.msg, out)
	for _, m := range out {
		s.send(e.node, m)
	}
}

// operate lets cache i read or write a page, or ask for it.
func (s *sim) operate(i int) {
	c := s.caches[i]
	pg := uint32(s.rng.IntN(c.Pages()))
	excl := s.rng.IntN(2) == 0
	if excl {
		if data, ok := c.Writable(s.now, pg); ok {
			s.values++
			binary.LittleEndian.PutUint64(data, s.values)
			c.Wrote(pg)
			s.logf("cache %d writes %d to page %d", i, s.values, pg)
			for _, m := range c.Done(pg) {
				s.send(i, m)
			}
			return
		}
	} else if data, ok := c.Readable(s.now, pg); ok {
		s.logf("cache %d reads %d from page %d", i, binary.LittleEndian.Uint64(data), pg)
		for _, m := range c.Done(pg) {
			s.send(i, m)
		}
		return
	}
	m, err := c.Request(s.now, pg, excl)
	if err != nil {
		s.logf("cache %d: request page %d: %v", i, pg, err)
		return
	}
	s.send(i, m)
}

// step does one random thing.
func (s *sim) step() {
	i := s.rng.IntN(len(s.caches))
	c := s.caches[i]
	switch r := s.rng.IntN(100); {
	case r < 25:
		s.operate(i)
	case r < 70:
		s.deliver()
	case r < 75:
		pg := uint32(s.rng.IntN(c.Pages()))
		if m, ok := c.WriteBack(pg, Mode(s.rng.IntN(3))); ok {
			s.send(i, m)
		}
	case r < 78:
		pg := uint32(s.rng.IntN(c.Pages()))
		if m, ok := c.Release(pg); ok {
			s.send(i, m)
		}
	case r < 85:
		if len(s.rpcs[i]) > 0 { // a sender retries a request not answered yet
			e := s.rpcs[i][s.rng.IntN(len(s.rpcs[i]))]
			s.net = append(s.net, e)
			s.logf("cache %d resends %s", i, e.msg)
		}
	default:
		s.now = s.now.Add(time.Duration(s.rng.IntN(int(s.cfg.Lease / 8))))
		s.push(s.dir.Tick(s.now, s.cfg.Lease/10))
	}
	s.check()
}

// check verifies the invariants: the directory's own, and across caches a
// single writer or many readers per page at every instant, every valid
// shared copy holding the home's data.
func (s *sim) check() {
	if err := s.dir.Check(); err != nil {
		s.fail("directory: %v", err)
	}
	for pg := range s.dir.Pages() {
		var mod, shared []int
		for i, c := range s.caches {
			switch c.State(s.now, uint32(pg)) {
			case Modified:
				mod = append(mod, i)
			case Shared:
				shared = append(shared, i)
			}
		}
		if len(mod) > 1 || (len(mod) == 1 && len(shared) > 0) {
			s.fail("page %d: caches %v hold it modified and %v shared at once", pg, mod, shared)
		}
		st, owner, _ := s.dir.State(uint32(pg))
		if len(mod) == 1 && (st != Modified || owner != SharerID(mod[0]+1)) {
			s.fail("page %d: cache %d holds it modified but the directory says %s owner %d", pg, mod[0], st, owner)
		}
		home := s.dir.pageData(uint32(pg))
		for _, i := range shared {
			if st == Modified && owner == SharerID(i+1) {
				continue // a downgraded owner: its data rides its InvAck
			}
			if d, _ := s.caches[i].Readable(s.now, uint32(pg)); !slices.Equal(d, home) {
				s.fail("page %d: cache %d reads %d but the home holds %d", pg, i, binary.LittleEndian.Uint64(d), binary.LittleEndian.Uint64(home))
			}
		}
	}
}

func TestRandomInterleavings(t *testing.T) {
	cases := []struct {
		name      string
		nodes     int
		pages     int
		drop, dup float64
	}{
		{"reliable", 3, 2, 0, 0},
		{"drops", 3, 2, 0.1, 0},
		{"duplicates", 3, 2, 0, 0.1},
		{"drops and duplicates", 4, 3, 0.1, 0.1},
		{"lossy", 3, 1, 0.3, 0.2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(20) {
				s := newSim(t, seed, tc.nodes, tc.pages, tc.drop, tc.dup)
				for range *randomSteps {
					s.step()
				}
			}
		})
	}
}
