package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/redundancy"
)

// The role "evac-load" of the evacuation tests: an application whose rdma
// segments sit on the node being evacuated, writing, reading and adding on
// them the whole time, and keeping the account that says whether anything
// was lost.
const (
	// segCountEnv is how many segments an evac-load client allocates.
	segCountEnv = "FARMEM_TEST_SEGMENTS"
	// evacSlot is the unit of the load's writes and reads. Slot 0 of each
	// segment holds its Add64 counter; the others hold versioned data.
	evacSlot = 4096
	// evacWorkers is how many goroutines of a client run operations; each
	// owns every evacWorkers-th segment, so each slot has one writer and
	// its reads come after its writes.
	evacWorkers = 2
	// streamChunk is the read size of the streaming phase.
	streamChunk = 1 << 20
	// evacRedundancyEnv, when set, is the redundancy of each segment in
	// turn, space-separated (poold --default-redundancy's form, e.g.
	// "replicas=2 ec=4+2"); "none" for a plain one.
	evacRedundancyEnv = "FARMEM_TEST_REDUNDANCY"
	// evacCheckEnv, when set, is a file the client waits for after its
	// load stopped and before it reads everything back; meanwhile it has
	// printed "paused " and each segment's Redundancy() as JSON.
	evacCheckEnv = "FARMEM_TEST_CHECK_GATE"
)

func init() { clientRoles["evac-load"] = roleEvacLoad }

// evacResult is what an evac-load client prints at the end, as JSON after
// "result ".
type evacResult struct {
	// Homes is each segment's home at the end; every home of a
	// redundant one.
	Homes []string `json:"homes"`
	// StreamBytesPerSec is the client's streaming read rate from the
	// segments' first home, measured before the load.
	StreamBytesPerSec float64 `json:"stream_bytes_per_sec"`
	OpsBefore         float64 `json:"ops_before"` // ops/s from the load's start to the evacuation's
	OpsDuring         float64 `json:"ops_during"` // ops/s while the evacuation ran
	P99BeforeUs       int64   `json:"p99_before_us"`
	P99DuringUs       int64   `json:"p99_during_us"`
	MaxDuringUs       int64   `json:"max_during_us"`
	// FollowUs are the durations of the operations that found their
	// segment moved and followed it to its new home: the pauses the
	// client saw.
	FollowUs      []int64  `json:"follow_us"`
	Ops           int      `json:"ops"`
	Writes        int      `json:"writes"`
	Adds          int      `json:"adds"`
	Failed        []string `json:"failed"`        // operations that returned an error other than indeterminate
	Indeterminate int      `json:"indeterminate"` // operations whose outcome is unknown (a home restarted)
	Mismatches    []string `json:"mismatches"`    // reads that saw other bytes than the last acknowledged write
	Lost          []string `json:"lost"`          // acknowledged writes or adds missing at the end
	// DataConnects is how many data-plane connections the client
	// opened, MovePreconnects how many of them ahead of a move;
	// MoveHandovers how many operations went from an old home's MOVED
	// straight to the new home (alloc.ClientStats).
	DataConnects    int64 `json:"data_connects"`
	MovePreconnects int64 `json:"move_preconnects"`
	MoveHandovers   int64 `json:"move_handovers"`
}

// evacSeg is one segment of an evac-load client and its account.
type evacSeg struct {
	idx int
	seg *alloc.Segment
	// acked is each slot's last acknowledged version; maybe is a version
	// whose write was indeterminate after it (either may be there).
	acked, maybe    []uint64
	adds, addsMaybe uint64
}

// evacOp is one operation's start (Unix ns) and duration.
type evacOp struct {
	at  int64
	dur time.Duration
}

// fillSlot writes slot's contents at version ver of segment seg into b.
func fillSlot(b []byte, seg, slot int, ver uint64) {
	binary.LittleEndian.PutUint64(b, ver)
	binary.LittleEndian.PutUint64(b[8:], uint64(seg)<<32|uint64(slot))
	x := byte(ver*31 + uint64(slot)*7 + uint64(seg)*3)
	for i := 16; i < len(b); i++ {
		b[i] = x + byte(i)
	}
}

// checkSlot reports whether b holds slot at one of the versions vs.
func checkSlot(b []byte, seg, slot int, vs ...uint64) (uint64, bool) {
	ver := binary.LittleEndian.Uint64(b)
	if !slices.Contains(vs, ver) {
		return ver, false
	}
	want := make([]byte, len(b))
	fillSlot(want, seg, slot, ver)
	return ver, string(want) == string(b)
}

// roleEvacLoad allocates segCountEnv rdma segments of sizeEnv bytes,
// writes every slot at version 0 and prints "ready <home>,<home>,...". At
// the gate file it streams all segments once (the data plane's streaming
// rate), prints "streamed", then runs its workers until the stop file
// appears; the file holds the evacuation's start and end in Unix ms. It
// then reads everything back against its account and prints the result.
func roleEvacLoad(ctx context.Context) error {
	n, err := strconv.Atoi(os.Getenv(segCountEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", segCountEnv, err)
	}
	size, err := strconv.ParseInt(os.Getenv(sizeEnv), 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", sizeEnv, err)
	}
	c, err := dialTarget(ctx, alloc.WithOpTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	slots := int(size / evacSlot)
	segs := make([]*evacSeg, n)
	buf := make([]byte, size)
	var homes []string
	reds, err := evacRedundancy(n)
	if err != nil {
		return err
	}
	for i := range segs {
		seg, err := c.Alloc(ctx, size, append(reds[i], alloc.WithTier(alloc.TierRDMA))...)
		if err != nil {
			return fmt.Errorf("alloc %d: %w", i, err)
		}
		clear(buf[:evacSlot])
		for k := 1; k < slots; k++ {
			fillSlot(buf[k*evacSlot:(k+1)*evacSlot], i, k, 0)
		}
		if _, err := seg.WriteAt(buf, 0); err != nil {
			return fmt.Errorf("fill %d: %w", i, err)
		}
		segs[i] = &evacSeg{idx: i, seg: seg, acked: make([]uint64, slots), maybe: make([]uint64, slots)}
		homes = append(homes, seg.Node())
	}
	fmt.Println("ready", strings.Join(homes, ","))
	if err := waitFile(os.Getenv(gateEnv), 2*time.Minute); err != nil {
		return err
	}
	res := &evacResult{}
	start := time.Now()
	for _, s := range segs {
		for off := int64(0); off < size; off += streamChunk {
			if _, err := s.seg.ReadAt(buf[:min(streamChunk, size-off)], off); err != nil {
				return fmt.Errorf("stream segment %d: %w", s.idx, err)
			}
		}
	}
	res.StreamBytesPerSec = float64(int64(n)*size) / time.Since(start).Seconds()
	fmt.Println("streamed")

	var stop atomic.Bool
	var window []byte
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			if b, err := os.ReadFile(os.Getenv(stopEnv)); err == nil && strings.Count(string(b), "\n") == 1 {
				window = b
				stop.Store(true)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	loadStart := time.Now()
	var mu sync.Mutex
	var ops []evacOp
	var wg sync.WaitGroup
	for w := range evacWorkers {
		wg.Go(func() {
			mine := evacLoad(segs, w, slots, &stop, res, &mu)
			mu.Lock()
			ops = append(ops, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	<-stopped
	var from, to int64
	if _, err := fmt.Sscanf(string(window), "%d %d", &from, &to); err != nil {
		return fmt.Errorf("stop file %q: %w", window, err)
	}
	res.summarize(ops, loadStart.UnixNano(), from*1e6, to*1e6)
	if gate := os.Getenv(evacCheckEnv); gate != "" {
		var st []alloc.RedundancyStatus
		for _, s := range segs {
			st = append(st, s.seg.Redundancy())
		}
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		fmt.Println("paused", string(b))
		if err := waitFile(gate, 2*time.Minute); err != nil {
			return err
		}
	}
	res.verify(segs, buf[:size])
	for _, s := range segs {
		st := s.seg.Redundancy()
		if len(st.Homes) == 0 {
			res.Homes = append(res.Homes, s.seg.Node())
		}
		for _, h := range st.Homes {
			res.Homes = append(res.Homes, h.Node)
		}
	}
	st := c.Stats()
	res.DataConnects, res.MovePreconnects, res.MoveHandovers = st.DataConnects, st.MovePreconnects, st.MoveHandovers
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println("result", string(b))
	return nil
}

// evacRedundancy is the allocation options of n segments that
// evacRedundancyEnv asks for: none when it is not set.
func evacRedundancy(n int) ([][]alloc.AllocOption, error) {
	out := make([][]alloc.AllocOption, n)
	env := os.Getenv(evacRedundancyEnv)
	if env == "" {
		return out, nil
	}
	specs := strings.Fields(env)
	if len(specs) != n {
		return nil, fmt.Errorf("%s=%q names %d redundancies for %d segments", evacRedundancyEnv, env, len(specs), n)
	}
	for i, text := range specs {
		s, err := redundancy.Parse(text)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s: %w", evacRedundancyEnv, err)
		case s.Coded():
			out[i] = []alloc.AllocOption{alloc.WithRedundancy(alloc.ErasureCoded(s.Data, s.Parity))}
		case s.Replicas > 1:
			out[i] = []alloc.AllocOption{alloc.WithRedundancy(alloc.Replicas(s.Replicas))}
		}
	}
	return out, nil
}

// evacLoad runs worker w's operations on its segments until stop: a write
// of a slot at its next version, a read of a slot checked against the
// account, or an Add64 of the segment's counter. It returns the
// operations' times; failures and mismatches go to res.
func evacLoad(segs []*evacSeg, w, slots int, stop *atomic.Bool, res *evacResult, mu *sync.Mutex) []evacOp {
	rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	var mine []*evacSeg
	for _, s := range segs {
		if s.idx%evacWorkers == w {
			mine = append(mine, s)
		}
	}
	note := func(list *[]string, format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(*list) < 20 {
			*list = append(*list, fmt.Sprintf(format, args...))
		}
	}
	var ops []evacOp
	b := make([]byte, evacSlot)
	var writes, adds, indet int
	for !stop.Load() {
		s := mine[rng.IntN(len(mine))]
		slot := 1 + rng.IntN(slots-1)
		off := int64(slot) * evacSlot
		home := s.seg.Node()
		start := time.Now()
		var err error
		switch k := rng.IntN(10); {
		case k < 5:
			ver := max(s.acked[slot], s.maybe[slot]) + 1
			fillSlot(b, s.idx, slot, ver)
			if _, err = s.seg.WriteAt(b, off); err == nil {
				s.acked[slot], s.maybe[slot] = ver, 0
				writes++
			} else if errors.Is(err, alloc.ErrIndeterminate) {
				s.maybe[slot] = ver
			}
		case k < 9:
			if _, err = s.seg.ReadAt(b, off); err == nil {
				if ver, ok := checkSlot(b, s.idx, slot, s.acked[slot], s.maybe[slot]); !ok {
					note(&res.Mismatches, "segment %d slot %d: read version %d, acknowledged %d", s.idx, slot, ver, s.acked[slot])
				}
			}
		default:
			if _, err = s.seg.Add64(0, 1); err == nil {
				s.adds++
				adds++
			} else if errors.Is(err, alloc.ErrIndeterminate) {
				s.addsMaybe++
			}
		}
		dur := time.Since(start)
		ops = append(ops, evacOp{at: start.UnixNano(), dur: dur})
		if s.seg.Node() != home {
			mu.Lock()
			res.FollowUs = append(res.FollowUs, dur.Microseconds())
			mu.Unlock()
		}
		switch {
		case err == nil:
		case errors.Is(err, alloc.ErrIndeterminate):
			indet++
		default:
			note(&res.Failed, "segment %d: %v", s.idx, err)
		}
	}
	mu.Lock()
	res.Writes += writes
	res.Adds += adds
	res.Indeterminate += indet
	mu.Unlock()
	return ops
}

// summarize computes the rates and latencies before the evacuation
// (from the load's start) and during it ([from, to), Unix ns).
func (res *evacResult) summarize(ops []evacOp, loadStart, from, to int64) {
	res.Ops = len(ops)
	var before, during []time.Duration
	for _, o := range ops {
		switch {
		case o.at >= loadStart && o.at < from:
			before = append(before, o.dur)
		case o.at >= from && o.at < to:
			during = append(during, o.dur)
		}
	}
	p99 := func(d []time.Duration) int64 {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return d[len(d)*99/100].Microseconds()
	}
	if from > loadStart {
		res.OpsBefore = float64(len(before)) / (float64(from-loadStart) / 1e9)
	}
	if to > from {
		res.OpsDuring = float64(len(during)) / (float64(to-from) / 1e9)
	}
	res.P99BeforeUs, res.P99DuringUs = p99(before), p99(during)
	if len(during) > 0 {
		res.MaxDuringUs = during[len(during)-1].Microseconds()
	}
}

// verify reads every segment back and checks each slot and counter
// against the account.
func (res *evacResult) verify(segs []*evacSeg, buf []byte) {
	for _, s := range segs {
		if _, err := s.seg.ReadAt(buf, 0); err != nil {
			res.Lost = append(res.Lost, fmt.Sprintf("segment %d: read back: %v", s.idx, err))
			continue
		}
		for slot := 1; slot < len(s.acked); slot++ {
			if ver, ok := checkSlot(buf[slot*evacSlot:(slot+1)*evacSlot], s.idx, slot, s.acked[slot], s.maybe[slot]); !ok && len(res.Lost) < 20 {
				res.Lost = append(res.Lost, fmt.Sprintf("segment %d slot %d: version %d, acknowledged %d", s.idx, slot, ver, s.acked[slot]))
			}
		}
		if got := binary.LittleEndian.Uint64(buf); got < s.adds || got > s.adds+s.addsMaybe {
			res.Lost = append(res.Lost, fmt.Sprintf("segment %d: counter %d, %d adds acknowledged (%d indeterminate)", s.idx, got, s.adds, s.addsMaybe))
		}
	}
}
