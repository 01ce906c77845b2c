package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/coherence/lincheck"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/session"
)

// moveCluster is three real poolds for the move tests: a, whose clients'
// rdma segments live on its peers, and b and c, which lend memory.
type moveCluster struct {
	a, b, c    *daemon
	na, nb, nc gossipNode
	bArgs      []string
	cArgs      []string
	aArgs      []string
	metricsA   string    // a's /metrics
	started    []*daemon // every run, checked for data races at the end
}

// client dials a's daemon as client id, closed when the test ends.
func (mc *moveCluster) client(t *testing.T, id string) *alloc.Client {
	c, err := alloc.Dial(t.Context(), mc.na.sock, alloc.WithClientID(id))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// start runs the poold of n with args.
func (mc *moveCluster) start(t *testing.T, n gossipNode, args ...string) *daemon {
	d := startDaemon(t, n.data, n.sock, args...)
	mc.started = append(mc.started, d)
	return d
}

// startMoveCluster starts a, b and c (each of b and c lending export
// bytes; extra are flags of all three) and waits until a sees both
// lenders' memory.
func startMoveCluster(t *testing.T, export string, extra ...string) *moveCluster {
	mc := &moveCluster{na: tlsGossip(t, "a"), nb: tlsGossip(t, "b"), nc: tlsGossip(t, "c")}
	key := certs.GossipKeyFile(certDir(t))
	mc.metricsA = freeAddr(t, "tcp")
	t.Cleanup(func() {
		for _, d := range mc.started {
			if strings.Contains(d.log.String(), "DATA RACE") {
				t.Errorf("poold %s reported a data race", d.socket)
			}
		}
	})
	mc.aArgs = slices.Concat(mc.na.args(), []string{"--gossip-key-file", key, "--metrics", mc.metricsA}, extra)
	mc.a = mc.start(t, mc.na, mc.aArgs...)
	mc.bArgs = slices.Concat(mc.nb.args(), []string{"--gossip-key-file", key, "--export-size", export, "--join", mc.na.gossip}, extra)
	mc.b = mc.start(t, mc.nb, mc.bArgs...)
	mc.cArgs = slices.Concat(mc.nc.args(), []string{"--gossip-key-file", key, "--export-size", export, "--join", mc.na.gossip}, extra)
	mc.c = mc.start(t, mc.nc, mc.cArgs...)
	waitLenders(t, mc.na.sock, "b", "c")
	return mc
}

// other is the lender that is not node.
func other(node string) string {
	if node == "b" {
		return "c"
	}
	return "b"
}

// TestMoveKeepsBytes: a named segment a placed on b or c moves to the
// other lender with alloc.Client.Move and back; after each move its bytes
// are there, writes and atomics land at the new home, both for its owner
// and for a client that attached it before (authorized at the new home,
// it follows the move on its next operation), and the old home's memory
// is free again.
func TestMoveKeepsBytes(t *testing.T) {
	mc := startMoveCluster(t, "32MiB")
	c := mc.client(t, "move-app")
	seg, want := moveBig(t, c, 4<<20, alloc.WithName("moved"))
	attached, err := mc.client(t, "move-reader").Attach(t.Context(), "moved")
	require.NoError(t, err)
	requireWhole(t, attached, want)
	for i := range 2 {
		from := seg.Node()
		require.NoError(t, c.Move(t.Context(), seg, alloc.ToNode(other(from))), "move %d", i)
		require.Equal(t, other(from), seg.Node(), "move %d: the segment names its new home", i)
		requireWhole(t, seg, want)
		requireWhole(t, attached, want)
		require.Equal(t, other(from), attached.Node(), "move %d: the attacher followed", i)
		_, fn, _ := mc.lender(from)
		require.Eventually(t, func() bool { ids, err := lentIDs(t, fn.sock); return err == nil && len(ids) == 0 },
			10*time.Second, 50*time.Millisecond, "move %d: %s still holds the segment", i, from)
	}
}

// TestMovePreconnects: the clients of a segment that moves live connect
// to its new home's data plane on their daemon's notice, which comes
// before the seal, rather than at their first operation there, which
// would put the handshake in the switch-over pause, and learn the new
// home at the switch-over from a second notice rather than from a Stat
// after being told MOVED: while they run no operation, moves (by memctl)
// open their connection to the new home (MovePreconnects) and their
// segment names the new home, both for the owner and for an attacher,
// and the operations at the new home then run on that connection (no
// other DataConnects). A client that neither owns nor attached the
// segment is told nothing and connects to nothing, and a connection a
// client has already is not opened again.
func TestMovePreconnects(t *testing.T) {
	mc := startMoveCluster(t, "32MiB")
	owner := mc.client(t, "preconnect-owner")
	seg, want := moveBig(t, owner, 1<<20, alloc.WithName("preconnected"))
	reader := mc.client(t, "preconnect-reader")
	attached, err := reader.Attach(t.Context(), "preconnected")
	require.NoError(t, err)
	requireWhole(t, attached, want)
	stranger := mc.client(t, "preconnect-stranger")
	_, err = stranger.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	clients := map[string]*alloc.Client{"owner": owner, "attacher": reader}
	for name, c := range clients {
		require.Equal(t, alloc.ClientStats{DataConnects: 1}, dataStats(c), "%s before the moves", name)
	}
	for i := range 3 {
		from := seg.Node()
		var mv moveView
		require.NoError(t, memctlJSON(t.Context(), mc.na.sock, &mv, "move", strconv.FormatUint(seg.ID(), 10), "--to", other(from)), "move %d", i)
		for name, c := range clients {
			// The first move connects each to the new home ahead; the
			// others go back and forth between homes it is connected to.
			ahead := alloc.ClientStats{DataConnects: 2, MovePreconnects: 1}
			require.Eventually(t, func() bool { return dataStats(c) == ahead }, 10*time.Second, 10*time.Millisecond,
				"move %d: %s connected ahead to the new home %s: %+v", i, name, other(from), dataStats(c))
		}
		for name, h := range map[string]*alloc.Segment{"owner": seg, "attacher": attached} {
			require.Eventually(t, func() bool { return h.Node() == other(from) }, 10*time.Second, 10*time.Millisecond,
				"move %d: the %s's segment names its new home %s before any operation: %s", i, name, other(from), h.Node())
		}
		requireWhole(t, seg, want)
		requireWhole(t, attached, want)
		for name, c := range clients {
			require.Equal(t, alloc.ClientStats{DataConnects: 2, MovePreconnects: 1}, dataStats(c), "move %d: %s's operations at the new home dialed nothing", i, name)
		}
	}
	require.Zero(t, stranger.Stats().MovePreconnects, "a client that neither owns nor attached the segment")
}

// dataStats is c's data-plane connection counters alone.
func dataStats(c *alloc.Client) alloc.ClientStats {
	s := c.Stats()
	return alloc.ClientStats{DataConnects: s.DataConnects, MovePreconnects: s.MovePreconnects}
}

// moveView is `memctl move -o json`.
type moveView struct {
	Segment     uint64 `json:"segment"`
	From        string `json:"from"`
	To          string `json:"to"`
	BytesCopied uint64 `json:"bytes_copied"`
	Rounds      uint32 `json:"rounds"`
	PauseUs     int64  `json:"pause_us"`
}

// moveLoad runs operations on a segment until stop: counters add to word 0,
// registers read, write and compare-and-swap words 1 to moveRegisters
// (recorded for the linearizability check), writers write 4 KiB blocks of
// their own area and remember the last acknowledged content of each. Every
// operation must succeed.
type moveLoad struct {
	seg *alloc.Segment
	// segs, when set, are handles of seg by several clients: the
	// workload's goroutines take turns over them (see at).
	segs []*alloc.Segment
	// tolerate takes ErrIndeterminate for an answer (a write or atomic
	// that may or may not have taken effect), accounted for by check:
	// unknown outcomes in the history, the counter within [adds, adds +
	// maybeAdds], a block holding its last acknowledged fill or a later
	// maybe-applied one. Otherwise every operation must succeed.
	tolerate  bool
	maybeAdds atomic.Int64
	maybe     [moveWriters]map[int64][]byte // writer's block offset -> fills of indeterminate writes since the last acknowledged
	rec       *lincheck.Recorder
	adds      atomic.Int64
	ops       atomic.Int64
	failed    atomic.Int64
	blocks    [moveWriters]map[int64]byte // writer's block offset -> fill byte last acknowledged
	errMu     sync.Mutex
	lastErr   error
}

const (
	moveRegisters = 3
	moveWriters   = 2
	moveArea      = 1 << 20 // bytes of each writer's area
	moveAreaStart = 64 << 10
	moveBlock     = 4096
)

// at is the handle goroutine g of the workload uses.
func (l *moveLoad) at(g int) *alloc.Segment {
	if len(l.segs) == 0 {
		return l.seg
	}
	return l.segs[g%len(l.segs)]
}

// unknown reports whether err is an outcome the load tolerates.
func (l *moveLoad) unknown(err error) bool {
	return l.tolerate && errors.Is(err, alloc.ErrIndeterminate)
}

func (l *moveLoad) fail(err error) {
	l.failed.Add(1)
	l.errMu.Lock()
	l.lastErr = err
	l.errMu.Unlock()
}

// run starts the workload's goroutines on wg; they end when stop closes.
func (l *moveLoad) run(wg *sync.WaitGroup, stop <-chan struct{}) {
	for g := range 2 { // counters: an add that returned n is recorded as a CAS from n-1 to n
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				call := l.rec.Now()
				n, err := l.at(g).Add64(0, 1)
				if l.unknown(err) {
					l.maybeAdds.Add(1)
					continue
				}
				if err != nil {
					l.fail(fmt.Errorf("add: %w", err))
					continue
				}
				l.rec.Add(2+g, lincheck.Input{Kind: lincheck.CAS, Key: 0, Old: n - 1, New: n}, lincheck.Output{Swapped: true}, call)
				l.adds.Add(1)
				l.ops.Add(1)
			}
		})
	}
	for g := range 2 { // registers
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 7))
			seq := uint64(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := 1 + rnd.IntN(moveRegisters)
				off := int64(key * 8)
				call := l.rec.Now()
				seq++
				val := uint64(g+1)<<32 | seq
				var err error
				switch rnd.IntN(3) {
				case 0:
					var v uint64
					if v, err = l.at(g + 2).Load64(off); err == nil {
						l.rec.Add(g, lincheck.Input{Kind: lincheck.Read, Key: key}, lincheck.Output{Value: v}, call)
					}
				case 1:
					if err = l.at(g+2).Store64(off, val); err == nil {
						l.rec.Add(g, lincheck.Input{Kind: lincheck.Write, Key: key, Value: val}, lincheck.Output{}, call)
					} else if l.unknown(err) {
						l.rec.AddUnknown(g, lincheck.Input{Kind: lincheck.Write, Key: key, Value: val}, call)
						err = nil
					}
				default:
					old := uint64(0)
					if rnd.IntN(2) == 0 { // a likely value: what this goroutine last saw there
						if old, err = l.at(g + 2).Load64(off); err != nil {
							break
						}
						call = l.rec.Now()
					}
					var ok bool
					if ok, err = l.at(g+2).CompareAndSwap64(off, old, val); err == nil {
						l.rec.Add(g, lincheck.Input{Kind: lincheck.CAS, Key: key, Old: old, New: val}, lincheck.Output{Swapped: ok}, call)
					} else if l.unknown(err) {
						l.rec.AddUnknown(g, lincheck.Input{Kind: lincheck.CAS, Key: key, Old: old, New: val}, call)
						err = nil
					}
				}
				if err != nil {
					l.fail(fmt.Errorf("register %d: %w", key, err))
					continue
				}
				l.ops.Add(1)
			}
		})
	}
	for w := range moveWriters {
		l.blocks[w], l.maybe[w] = map[int64]byte{}, map[int64][]byte{}
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
			buf := make([]byte, moveBlock)
			for fill := byte(1); ; fill = fill%250 + 1 {
				select {
				case <-stop:
					return
				default:
				}
				off := int64(moveAreaStart + w*moveArea + rnd.IntN(moveArea/moveBlock)*moveBlock)
				for i := range buf {
					buf[i] = fill
				}
				if _, err := l.at(w+4).WriteAt(buf, off); l.unknown(err) {
					l.maybe[w][off] = append(l.maybe[w][off], fill)
					continue
				} else if err != nil {
					l.fail(fmt.Errorf("write at %d: %w", off, err))
					continue
				}
				l.blocks[w][off] = fill
				delete(l.maybe[w], off)
				if _, err := l.at(w+4).ReadAt(buf, off); err != nil {
					l.fail(fmt.Errorf("read at %d: %w", off, err))
					continue
				}
				if buf[0] != fill || buf[moveBlock-1] != fill {
					l.fail(fmt.Errorf("read at %d: %d, %d after writing %d", off, buf[0], buf[moveBlock-1], fill))
				}
				l.ops.Add(2)
			}
		})
	}
}

// check reads everything back after the load stopped: the counter holds
// every acknowledged add, each block its last acknowledged write, and the
// registers' history is linearizable.
func (l *moveLoad) check(t *testing.T) {
	l.errMu.Lock()
	require.Zero(t, l.failed.Load(), "operations failed during the moves; the last: %v", l.lastErr)
	l.errMu.Unlock()
	n, err := l.seg.Load64(0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, uint64(l.adds.Load()), "every acknowledged Add64 applied")
	require.LessOrEqual(t, n, uint64(l.adds.Load()+l.maybeAdds.Load()), "no Add64 applied twice (%d of unknown outcome)", l.maybeAdds.Load())
	buf := make([]byte, moveBlock)
	for w := range moveWriters {
		for off := range l.maybe[w] {
			if _, ok := l.blocks[w][off]; !ok {
				l.blocks[w][off] = 0 // never acknowledged: zero, or a maybe-applied fill
			}
		}
		for off, fill := range l.blocks[w] {
			_, err := l.seg.ReadAt(buf, off)
			require.NoError(t, err)
			ok := append([]byte{fill}, l.maybe[w][off]...)
			require.True(t, bytes.Count(buf, buf[:1]) == moveBlock && bytes.IndexByte(ok, buf[0]) >= 0,
				"writer %d's block at %d holds %d..%d, not its last acknowledged fill %d or a later maybe-applied one %v", w, off, buf[0], buf[moveBlock-1], fill, l.maybe[w][off])
		}
	}
	ops := l.rec.Ops()
	if l.maybeAdds.Load() > 0 {
		// An add of unknown outcome returned no value to record it by: the
		// counter is checked by its range above, the registers alone here.
		ops = slices.DeleteFunc(ops, func(o porcupine.Operation) bool { return o.Input.(lincheck.Input).Key == 0 })
	}
	ok, path, err := lincheck.Check(ops, time.Minute, t.TempDir())
	require.NoError(t, err)
	require.True(t, ok, "the registers' history is not linearizable: %s", path)
}

// TestMoveUnderLoad: while a client adds to a counter, reads, writes and
// compare-and-swaps registers and writes blocks of a segment, memctl move
// moves it from its home to the other lender and back. No operation
// fails, the counter holds exactly the acknowledged adds, every block its
// last acknowledged write, and the history of the registers (counter adds
// included) is linearizable (porcupine).
func TestMoveUnderLoad(t *testing.T) {
	mc := startMoveCluster(t, "32MiB")
	ctx := t.Context()
	c := mc.client(t, "move-load")
	seg, err := c.Alloc(ctx, 4<<20, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	l := &moveLoad{seg: seg, rec: lincheck.NewRecorder()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	l.run(&wg, stop)
	defer func() { // stops the load if a require below ends the test
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	for i := range 2 {
		before := l.ops.Load()
		require.Eventually(t, func() bool { return l.ops.Load() > before+200 }, 20*time.Second, time.Millisecond, "the load runs before move %d", i)
		from := seg.Node()
		var mv moveView
		require.NoError(t, memctlJSON(ctx, mc.na.sock, &mv, "move", strconv.FormatUint(seg.ID(), 10), "--to", other(from)))
		require.Equal(t, moveView{Segment: seg.ID(), From: from, To: other(from), BytesCopied: mv.BytesCopied, Rounds: mv.Rounds, PauseUs: mv.PauseUs}, mv)
		require.GreaterOrEqual(t, mv.BytesCopied, uint64(seg.Size()), "the whole segment was copied")
		require.GreaterOrEqual(t, mv.Rounds, uint32(2), "a full copy and the last round")
		t.Logf("move %d: %s -> %s, %d bytes in %d rounds, pause %dµs, %d ops so far", i, mv.From, mv.To, mv.BytesCopied, mv.Rounds, mv.PauseUs, l.ops.Load())
	}
	before := l.ops.Load()
	require.Eventually(t, func() bool { return l.ops.Load() > before+200 }, 20*time.Second, time.Millisecond, "the load runs after the moves")
	close(stop)
	wg.Wait()
	require.Equal(t, other(other(seg.Node())), seg.Node())
	l.check(t)
	t.Logf("%d operations, %d adds, %d register operations checked", l.ops.Load(), l.adds.Load(), len(l.rec.Ops()))

	out, errOut, ok := memctlText(t, mc.na.sock, "move", strconv.FormatUint(seg.ID(), 10), "--to", other(seg.Node()))
	require.True(t, ok, "%s%s", out, errOut)
	require.Regexp(t, `^moved segment \d+ from [bc] to [bc]: .* copied in \d+ rounds, operations paused .*\n$`, out)
}

// lender is b's or c's daemon, socket and flags.
func (mc *moveCluster) lender(name string) (d **daemon, n gossipNode, args []string) {
	if name == "b" {
		return &mc.b, mc.nb, mc.bArgs
	}
	return &mc.c, mc.nc, mc.cArgs
}

// listed is every segment the daemon on sock holds, asked over its socket
// as an administrator (no memctl process: the kill tests poll it while a
// move runs).
func listed(t *testing.T, sock string) ([]*poolv1.Segment, error) {
	conn, err := session.Channel("unix", sock)
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	return poolv1.ListAll(ctx, poolv1.NewPoolClient(conn), &poolv1.ListRequest{}, 0)
}

// lentIDs are the ids of the segments the daemon on sock holds for peers.
func lentIDs(t *testing.T, sock string) ([]uint64, error) {
	segs, err := listed(t, sock)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, s := range segs {
		if strings.HasPrefix(s.Owner, "poold/") {
			ids = append(ids, s.Id)
		}
	}
	return ids, nil
}

// moveBig allocates an rdma segment of size (with opts) through a's
// client c and fills it with a pattern it returns.
func moveBig(t *testing.T, c *alloc.Client, size int, opts ...alloc.AllocOption) (*alloc.Segment, []byte) {
	seg, err := c.Alloc(t.Context(), int64(size), append(opts, alloc.WithTier(alloc.TierRDMA))...)
	require.NoError(t, err)
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*13 + i>>16)
	}
	_, err = seg.WriteAt(want, 0)
	require.NoError(t, err)
	return seg, want
}

// startKilledMove is the start of a kill test: the cluster (with a lease
// long enough for a killed a to come back in), a client of a with a 64 MiB
// segment holding want, and the segment's move to the other lender,
// copying: the target holds the copy. done receives the move's outcome.
func startKilledMove(t *testing.T) (mc *moveCluster, seg *alloc.Segment, want []byte, done <-chan error) {
	mc = startMoveCluster(t, "80MiB", "--lease-ttl", "10s")
	c := mc.client(t, "move-kill")
	seg, want = moveBig(t, c, 64<<20)
	to := other(seg.Node())
	_, tn, _ := mc.lender(to)
	moved := make(chan error, 1)
	go func() { moved <- c.Move(t.Context(), seg, alloc.ToNode(to)) }()
	require.Eventually(t, func() bool {
		ids, err := lentIDs(t, tn.sock)
		return err == nil && len(ids) > 0
	}, 20*time.Second, 2*time.Millisecond, "%s never received the copy", to)
	return mc, seg, want, moved
}

// requireWhole checks that seg holds want and takes writes and atomics,
// which it makes in want too.
func requireWhole(t *testing.T, seg *alloc.Segment, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	_, err := seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the segment's bytes")
	_, err = seg.WriteAt([]byte("written after"), 100)
	require.NoError(t, err, "the segment takes writes")
	copy(want[100:], "written after")
	n, err := seg.Add64(0, 1)
	require.NoError(t, err, "the segment takes atomics")
	require.Equal(t, binary.LittleEndian.Uint64(want)+1, n)
	binary.LittleEndian.PutUint64(want, n)
}

// TestMoveTargetKilled: kill -9 of the target's poold while a 64 MiB
// segment is copied to it: Move fails, the segment stays at its home whole
// and usable (unsealed), farmem_moves_total counts the failure, and once
// the target is back (listening on another port) its copy is freed by a,
// which asks it what it holds once it answers: the lease of a's session
// from before the kill, a peer's, runs for minutes.
func TestMoveTargetKilled(t *testing.T) {
	mc, seg, want, done := startKilledMove(t)
	home := seg.Node()
	target, tn, targetArgs := mc.lender(other(home))
	(*target).kill9(t)
	killed := time.Now()
	err := <-done
	t.Logf("move failed %v after the kill", time.Since(killed))
	require.Error(t, err, "the move to a killed target")
	t.Logf("move: %v", err)
	require.Equal(t, home, seg.Node())
	requireWhole(t, seg, want)
	_, hn, _ := mc.lender(home)
	ids, err := lentIDs(t, hn.sock)
	require.NoError(t, err)
	require.Len(t, ids, 1, "the home holds the segment, once")
	require.Equal(t, 1.0, mc.movesCounted(t, "failed"))
	require.Equal(t, 0.0, mc.movesCounted(t, "ok"))

	restart := time.Now()
	*target = mc.start(t, tn, targetArgs...)
	t.Logf("target restarted in %v", time.Since(restart))
	defer func() { t.Logf("target's copy freed %v after its restart", time.Since(restart)) }()
	require.Eventually(t, func() bool {
		ids, err := lentIDs(t, tn.sock)
		return err == nil && len(ids) == 0
	}, 30*time.Second, 50*time.Millisecond, "the restarted target still holds the failed move's copy")
}

// movesCounted reads farmem_moves_total{result} from a's /metrics.
func (mc *moveCluster) movesCounted(t *testing.T, result string) float64 {
	code, body := httpGet(mc.metricsA, "/metrics")
	require.Equal(t, http.StatusOK, code, body)
	return sampleValue(t, body, `farmem_moves_total{result="`+result+`"}`)
}

// TestMoveOriginKilled: kill -9 of a, the daemon that placed a 64 MiB
// segment and moves it, while the segment is copied. The Move call fails;
// a restarted a finds its move intent and finishes or undoes the move:
// afterwards exactly one home holds the segment (the target's copy of an
// undone move is freed), its bytes are whole, and it takes writes and
// atomics (the source is not left sealed).
func TestMoveOriginKilled(t *testing.T) {
	mc, seg, want, done := startKilledMove(t)
	home := seg.Node()
	_, tn, _ := mc.lender(other(home))
	_, hn, _ := mc.lender(home)
	mc.a.kill9(t)
	require.Error(t, <-done, "the move whose origin was killed")
	restart := time.Now()
	// The restarted a joins b (it was the first node, which joined nobody).
	mc.a = mc.start(t, mc.na, append(mc.aArgs, "--join", mc.nb.gossip)...)
	require.Eventually(t, func() bool {
		hs, err1 := lentIDs(t, hn.sock)
		ts, err2 := lentIDs(t, tn.sock)
		return err1 == nil && err2 == nil && len(hs)+len(ts) == 1
	}, 30*time.Second, 50*time.Millisecond, "one home holds the segment after a's restart")
	requireWhole(t, seg, want)
	t.Logf("move resolved %v after a's restart; the segment is on %s (it was on %s)", time.Since(restart), seg.Node(), home)
	require.Contains(t, mc.a.log.String(), "finishing a move the last run left")
	require.Equal(t, 0.0, mc.movesCounted(t, "ok"))
}

// TestMoveRefusals: what cannot move is refused with a typed error that
// says why, through alloc.Client.Move and memctl move, and leaves the
// segment where it was: a cxl segment with no other tier to go to (and
// an administrator's move to the cxl tier while the owner holds a
// session: tiermove_linux_test.go tests the tier moves), the
// segment's own home, this daemon, an unknown node (the alive ones are
// listed), a draining node, a shared segment, a second move of a segment
// already moving, a segment freed during its move (nothing is left on
// either home), and a dead node.
func TestMoveRefusals(t *testing.T) {
	mc := startMoveCluster(t, "40MiB")
	ctx := t.Context()
	c := mc.client(t, "move-refusals")
	refused := func(want error, substr string, err error) {
		t.Helper()
		require.ErrorIs(t, err, want)
		require.ErrorContains(t, err, substr)
	}
	memctlRefused := func(substr string, args ...string) {
		t.Helper()
		out, errOut, ok := memctlText(t, mc.na.sock, append([]string{"move"}, args...)...)
		require.False(t, ok, "memctl move %v: %s", args, out)
		require.Contains(t, errOut, substr)
	}

	cxl, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	refused(alloc.ErrInvalid, "moves only to the rdma tier", c.Move(ctx, cxl))
	memctlRefused("moves only to the rdma tier (--tier rdma)", strconv.FormatUint(cxl.ID(), 10))

	seg, want := moveBig(t, c, 1<<20)
	home := seg.Node()
	id := strconv.FormatUint(seg.ID(), 10)
	memctlRefused("in use: other clients hold the segment", id, "--tier", "cxl")
	refused(alloc.ErrInvalid, "lives on "+home+" already", c.Move(ctx, seg, alloc.ToNode(home)))
	refused(alloc.ErrInvalid, "a is this node", c.Move(ctx, seg, alloc.ToNode("a")))
	refused(alloc.ErrNotFound, "the alive members are a, b, c", c.Move(ctx, seg, alloc.ToNode("zz")))
	memctlRefused(`node "zz": not found: no such member; the alive members are a, b, c`, id, "--to", "zz")

	var dr drainView
	require.NoError(t, memctlJSON(ctx, mc.na.sock, &dr, "drain", other(home)))
	require.Eventually(t, func() bool { n, err := nodeSeen(t, mc.na.sock, other(home)); return err == nil && n.Draining },
		30*time.Second, 50*time.Millisecond, "a never saw %s drain", other(home))
	refused(alloc.ErrInvalid, "it is draining", c.Move(ctx, seg, alloc.ToNode(other(home))))
	refused(alloc.ErrNoCapacity, "no peer to move", c.Move(ctx, seg)) // the only other lender drains
	require.NoError(t, memctlJSON(ctx, mc.na.sock, &dr, "drain", other(home), "--undo"))
	require.Eventually(t, func() bool { n, err := nodeSeen(t, mc.na.sock, other(home)); return err == nil && !n.Draining },
		30*time.Second, 50*time.Millisecond, "a never saw %s's drain end", other(home))
	require.Equal(t, home, seg.Node())
	requireWhole(t, seg, want)

	// A shared segment: its home's coherence directory refuses the move.
	named, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA), alloc.WithName("move-shared"))
	require.NoError(t, err)
	sc := mc.client(t, "move-sharer")
	shared, err := sc.Attach(ctx, "move-shared", alloc.Shared())
	require.NoError(t, err)
	_, err = shared.ReadAt(make([]byte, 8), 0) // the home starts the segment's directory
	require.NoError(t, err)
	refused(alloc.ErrInvalid, "shared attachment", sc.Move(ctx, shared))
	refused(alloc.ErrInvalid, "it is a shared segment", c.Move(ctx, named, alloc.ToNode(other(named.Node()))))
	memctlRefused("it is a shared segment", "move-shared")
	_, err = named.WriteAt([]byte{1}, 0)
	require.NoError(t, err, "the shared segment's home is not left sealed")

	// A second move of a moving segment, and a free during a move.
	big, _ := moveBig(t, c, 24<<20)
	bigHome := big.Node()
	_, tn, _ := mc.lender(other(bigHome))
	before, err := lentIDs(t, tn.sock)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Move(ctx, big, alloc.ToNode(other(bigHome))) }()
	require.Eventually(t, func() bool {
		ids, err := lentIDs(t, tn.sock)
		return err == nil && len(ids) > len(before)
	}, 20*time.Second, 2*time.Millisecond, "%s never received the copy", other(bigHome))
	refused(alloc.ErrLimit, "one move of a segment at a time", c.Move(ctx, big, alloc.ToNode(other(bigHome))))
	require.NoError(t, big.Free(ctx))
	require.Error(t, <-done, "the move of a segment freed meanwhile")
	for _, node := range []string{"b", "c"} {
		_, n, _ := mc.lender(node)
		want := 0
		if node == named.Node() {
			want++
		}
		if node == home {
			want++
		}
		require.Eventually(t, func() bool {
			ids, err := lentIDs(t, n.sock)
			return err == nil && len(ids) == want
		}, 20*time.Second, 50*time.Millisecond, "%s holds something of the freed segment", node)
	}
	requireWhole(t, seg, want)

	// A dead node.
	dead, _, _ := mc.lender(other(home))
	(*dead).kill9(t)
	require.Eventually(t, func() bool { n, err := nodeSeen(t, mc.na.sock, other(home)); return err == nil && n.State != "alive" },
		30*time.Second, 50*time.Millisecond, "a never saw %s die", other(home))
	refused(alloc.ErrNotFound, "among the alive members", c.Move(ctx, seg, alloc.ToNode(other(home))))
	requireWhole(t, seg, want)
}

// moveMeasure is how many moves TestMovePause measures; 0 skips it.
var moveMeasure = flag.Int("move.measure", 0, "TestMovePause: moves of a 64 MiB segment to measure (0: skip)")

// TestMovePause measures, with -move.measure N, the switch-over pause of N
// moves of a 64 MiB segment between b and c while a client writes 4 KiB
// blocks and adds to a counter, the longest operation the client saw
// during them, and the move's copy bandwidth against the data plane's
// streaming bandwidth (the client reading the whole segment 1 MiB at a
// time, 4 reads in flight) in the same run.
// Run it without -race for the real speed (poold is then built without
// it too):
//
//	go test -run TestMovePause -count 1 ./cmd/poold -args -move.measure 20
func TestMovePause(t *testing.T) {
	if *moveMeasure == 0 {
		t.Skip("a measurement: run with -args -move.measure 20")
	}
	mc := startMoveCluster(t, "160MiB")
	ctx := t.Context()
	c := mc.client(t, "move-pause")
	const size = 64 << 20
	seg, _ := moveBig(t, c, size)

	stream := func() float64 {
		start := time.Now()
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				buf := make([]byte, 1<<20)
				for off := int64(g) << 20; off < size; off += 4 << 20 {
					if _, err := seg.ReadAt(buf, off); err != nil {
						t.Errorf("stream: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		return size / time.Since(start).Seconds()
	}

	var longest atomic.Int64 // ns
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 4096)
		rnd := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			_, err := seg.WriteAt(buf, int64(rnd.IntN(size/4096))*4096)
			if err == nil {
				_, err = seg.Add64(0, 1)
			}
			if err != nil {
				t.Errorf("load: %v", err)
				return
			}
			if d := int64(time.Since(start)); d > longest.Load() {
				longest.Store(d)
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	var pauses, moveBW, streamBW []float64
	for i := range *moveMeasure {
		streamBW = append(streamBW, stream())
		from := seg.Node()
		start := time.Now()
		var mv moveView
		require.NoError(t, memctlJSON(ctx, mc.na.sock, &mv, "move", strconv.FormatUint(seg.ID(), 10), "--to", other(from)))
		took := time.Since(start)
		pauses = append(pauses, float64(mv.PauseUs))
		moveBW = append(moveBW, float64(mv.BytesCopied)/took.Seconds())
		t.Logf("move %d: %s -> %s, %d bytes in %d rounds, %v, pause %dµs", i, mv.From, mv.To, mv.BytesCopied, mv.Rounds, took.Round(time.Millisecond), mv.PauseUs)
	}
	slices.Sort(pauses)
	pct := func(xs []float64, p float64) float64 { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
	slices.Sort(moveBW)
	slices.Sort(streamBW)
	t.Logf("switch-over pause over %d moves of 64 MiB under write load: p50 %.0fµs, p99 %.0fµs; longest client operation %v",
		len(pauses), pct(pauses, 0.5), pct(pauses, 0.99), time.Duration(longest.Load()).Round(time.Microsecond))
	t.Logf("move bandwidth p50 %.0f MB/s, data-plane streaming read p50 %.0f MB/s: ratio %.2f",
		pct(moveBW, 0.5)/1e6, pct(streamBW, 0.5)/1e6, pct(moveBW, 0.5)/pct(streamBW, 0.5))
}
