package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/syncbuf"
)

// withClient starts a daemon with one client that holds an rdma and a cxl
// segment and has moved bytes through the data plane.
func withClient(t *testing.T) (socket string, c *alloc.Client) {
	t.Helper()
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	c, err := alloc.Dial(t.Context(), cfg.Socket, alloc.WithClientName("webcache"), alloc.WithClientID("webcache-1"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	r, err := c.Alloc(t.Context(), 2<<20, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	_, err = c.Alloc(t.Context(), 4<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	_, err = r.WriteAt(make([]byte, 8192), 0)
	require.NoError(t, err)
	_, err = r.ReadAt(make([]byte, 100), 0)
	require.NoError(t, err)
	return cfg.Socket, c
}

func TestTopOnce(t *testing.T) {
	s, _ := withClient(t)
	out, stderr, code := memctl(t, s, "top", "--once", "--interval", "50ms")
	require.Zero(t, code, stderr)
	for _, want := range []string{"memctl top", "test-node", "TIER", "cxl", "local", "rdma", "EMULATED",
		"ALLOC/s", "DATA PLANE", "READS/s", "CLIENT", "webcache", "webcache-1", "6.0 MiB", "held"} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "\x1b[", "no terminal, no escape sequences")
	require.NotContains(t, out, " - ", "--once measures rates over one interval")
}

func TestTopOnceJSON(t *testing.T) {
	s, c := withClient(t)
	out, stderr, code := memctl(t, s, "top", "--once", "--interval", "50ms", "-o", "json")
	require.Zero(t, code, stderr)
	var v struct {
		Node       string  `json:"node"`
		RateWindow float64 `json:"rate_window_seconds"`
		Sessions   int64   `json:"sessions"`
		Tiers      []struct {
			Tier     string `json:"tier"`
			Used     int64  `json:"used"`
			Segments int64  `json:"segments"`
			Totals   struct {
				Allocations int64 `json:"allocations"`
				Reads       int64 `json:"reads"`
				Writes      int64 `json:"writes"`
				ReadBytes   int64 `json:"read_bytes"`
				WriteBytes  int64 `json:"write_bytes"`
			} `json:"totals"`
			Rates *struct {
				Allocations float64 `json:"allocations_per_second"`
			} `json:"rates"`
		} `json:"tiers"`
		Clients []struct {
			ID       string `json:"id"`
			Name     string `json:"name"`
			Sessions int64  `json:"sessions"`
			Segments int64  `json:"segments"`
			Bytes    int64  `json:"bytes"`
			Lease    string `json:"lease"`
		} `json:"clients"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.Equal(t, "test-node", v.Node)
	require.Greater(t, v.RateWindow, 0.0)
	require.Equal(t, int64(1), v.Sessions)
	require.Len(t, v.Tiers, 3)
	tiers := map[string]int{}
	for i, ti := range v.Tiers {
		tiers[ti.Tier] = i
		require.NotNil(t, ti.Rates, "%s: rates measured over the interval", ti.Tier)
		require.Zero(t, ti.Rates.Allocations, "%s: nothing allocated during the interval", ti.Tier)
	}
	rdma := v.Tiers[tiers["rdma"]]
	require.Equal(t, int64(1), rdma.Totals.Allocations)
	require.Equal(t, int64(1), rdma.Totals.Writes)
	require.Equal(t, int64(8192), rdma.Totals.WriteBytes)
	require.Equal(t, int64(1), rdma.Totals.Reads)
	require.Equal(t, int64(100), rdma.Totals.ReadBytes)
	require.Equal(t, int64(2<<20), rdma.Used)
	require.Len(t, v.Clients, 1)
	cl := v.Clients[0]
	require.Equal(t, "webcache-1", cl.ID)
	require.Equal(t, "webcache", cl.Name)
	require.Equal(t, int64(1), cl.Sessions)
	require.Equal(t, int64(2), cl.Segments)
	require.Equal(t, int64(6<<20), cl.Bytes)
	require.Equal(t, "held", cl.Lease)

	// Gone: the lease runs out, then the client's segments go with it.
	require.NoError(t, c.Close())
	out, _, code = memctl(t, s, "top", "--once", "--interval", "10ms", "-o", "json")
	require.Zero(t, code)
	require.Contains(t, out, `"lease": "expiring"`)
	require.Contains(t, out, `"lease_expires"`)
}

func TestTopStreams(t *testing.T) {
	s, _ := withClient(t)
	var out syncbuf.Buffer
	g := &globals{socket: s, output: "table", timeout: 10 * time.Second, out: &out}
	ctx, cancel := context.WithCancel(context.Background())
	tp := &top{g: g, interval: 20 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- tp.run(ctx) }()
	require.Eventually(t, func() bool { return strings.Count(out.String(), "memctl top") >= 3 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	// Each refresh is a snapshot of its own, not a redraw: the output goes
	// to a buffer, no terminal.
	got := out.String()
	require.NotContains(t, got, "\x1b[")
	require.Contains(t, got, "webcache")
	require.Contains(t, got, "\n\nmemctl top", "snapshots separated by a blank line")
}

func TestTopErrors(t *testing.T) {
	_, stderr, code := memctl(t, pooltest.SocketPath(t), "top", "--once")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no poold is listening")
	_, stderr, code = memctl(t, pooltest.SocketPath(t), "top", "--interval", "1ms")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--interval")
}

func TestRates(t *testing.T) {
	prev := topOps{Allocations: 10, Frees: 4, Reads: 100, ReadBytes: 4096}
	cur := topOps{Allocations: 30, Frees: 4, Reads: 300, ReadBytes: 4096 + 2048}
	r := rates(prev, cur, 2)
	require.Equal(t, &topRates{Allocations: 10, Reads: 100, ReadBytes: 1024}, r)
	require.Nil(t, rates(cur, prev, 2), "counters went back: the daemon restarted")
	require.Nil(t, rates(prev, cur, 0))
}

func TestTopRatesAcrossRestart(t *testing.T) {
	st := func(started int64, allocs int64) *topSample {
		return &topSample{at: time.Unix(100+started, 0), st: &poolv1.StatusResponse{
			StartedUnixMs: started, Tiers: []*poolv1.TierInfo{{Tier: poolv1.Tier_TIER_CXL, Capacity: 10}},
			Ops: []*poolv1.TierOps{{Tier: poolv1.Tier_TIER_CXL, Allocations: allocs}},
		}}
	}
	v := newTopView(st(1, 5), st(2, 7), time.Second)
	require.Zero(t, v.RateWindow, "another daemon: no rates")
	require.Nil(t, v.Tiers[0].Rates)
	v = newTopView(nil, st(1, 5), time.Second)
	require.Nil(t, v.Tiers[0].Rates, "first sample: no rates")
	require.Contains(t, string(v.render(0)), "-")
}

func TestInPlace(t *testing.T) {
	frame := []byte("a\nb\nc\n")
	require.Equal(t, "\x1b[Ha\x1b[K\r\nb\x1b[K\r\nc\x1b[K\x1b[J", string(inPlace(frame, 0)))
	require.Equal(t, "\x1b[Ha\x1b[K\r\nb\x1b[K\x1b[J", string(inPlace(frame, 2)), "cut to the screen, never scrolling it")
}

func TestTopRenderFitsScreen(t *testing.T) {
	v := &topView{Tiers: []topTier{{Tier: "cxl", Capacity: 1}}}
	for i := range 50 {
		v.Clients = append(v.Clients, topClient{ID: strings.Repeat("x", i+1), Lease: "held"})
	}
	full := strings.Count(string(v.render(0)), "\n")
	for _, rows := range []int{5, 10, 11, 12, 20, 40, full, full + 10} {
		out := string(v.render(rows))
		lines := strings.Count(out, "\n")
		if rows >= full {
			require.Equal(t, full, lines, "everything fits in %d rows", rows)
			continue
		}
		// The tables above the clients take 9 lines here and are never
		// cut (inPlace cuts what does not fit); the clients fill the rest.
		// (At 11 rows a client table would have room for its header only.)
		require.LessOrEqual(t, lines, max(rows, 10), "rows %d", rows)
		require.GreaterOrEqual(t, lines, min(rows-1, 10), "rows %d", rows)
		if rows >= 12 {
			require.Equal(t, rows, lines, "rows %d: the screen is filled", rows)
		}
		require.Contains(t, out, "clients", "rows %d: says what it left out", rows)
	}
}
