package alloc_test

import (
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/faultproxy"
	"github.com/farmem/farmem/internal/oncecheck"
	"github.com/farmem/farmem/internal/pooltest"
)

var onceOps = flag.Int("once.ops", 50_000, "adds and as many CASes that TestExactlyOnceUnderConnectionKills runs")

// onceSegment runs the oncecheck workload on an rdma segment through the
// public API.
type onceSegment struct{ seg *alloc.Segment }

func (o onceSegment) Add(context.Context) (uint64, error) {
	v, err := o.seg.Add64(0, 1)
	return v - 1, err
}

// CAS learns the previous value of a refused swap by reading the word: its
// goroutine is the word's only writer, so it still holds it.
func (o onceSegment) CAS(_ context.Context, w int, old, new uint64) (uint64, bool, error) {
	swapped, err := o.seg.CompareAndSwap64(int64(8*w), old, new)
	if err != nil || swapped {
		return old, swapped, err
	}
	prev, err := o.seg.Load64(int64(8 * w))
	return prev, false, err
}

func (o onceSegment) Load(_ context.Context, w int) (uint64, error) {
	return o.seg.Load64(int64(8 * w))
}

func (onceSegment) Indeterminate(err error) bool {
	return errors.Is(err, alloc.ErrIndeterminate) && errors.Is(err, alloc.ErrUnavailable)
}

// TestExactlyOnceUnderConnectionKills: Add64 and CompareAndSwap64 on an
// rdma segment, with the client's data plane going through a proxy that
// kills every connection each 50 ms and cuts half of them after a random
// number of reply bytes (requests delivered, replies lost): the counter
// equals the successful adds (plus at most the indeterminate ones), and no
// CAS that reports swapped=false stored its value.
func TestExactlyOnceUnderConnectionKills(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.LogLevel = "error" // the proxy's resets are expected
	pooltest.Start(t, cfg)
	var (
		mu      sync.Mutex
		proxies = map[string]*faultproxy.Proxy{}
	)
	defer func() {
		for _, p := range proxies {
			p.Close()
		}
	}()
	through := func(addr string) string {
		mu.Lock()
		defer mu.Unlock()
		if p := proxies[addr]; p != nil {
			return p.Addr()
		}
		p, err := faultproxy.Start(faultproxy.Config{Target: addr, ReplyBudget: func() int {
			if rand.IntN(2) == 0 {
				return 0
			}
			return 12 + rand.IntN(200*24) // the handshake reply, then up to 200 responses
		}})
		require.NoError(t, err)
		p.KillEvery(50 * time.Millisecond)
		proxies[addr] = p
		return p.Addr()
	}
	c := dial(t, cfg.Socket, alloc.WithDataAddr(through), alloc.WithBusyPoll(0))
	seg, err := c.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)

	start := time.Now()
	res := oncecheck.Run(t, t.Context(), onceSegment{seg}, *onceOps, 4)
	var kills int64
	mu.Lock()
	for _, p := range proxies {
		kills += p.Kills()
	}
	mu.Unlock()
	t.Logf("%d Add64 + %d CompareAndSwap64 in %v, %d connections killed: %+v", *onceOps, *onceOps, time.Since(start).Round(time.Millisecond), kills, res)
	require.Positive(t, kills, "the proxy killed no connection: the test exercised nothing")
	require.NoError(t, seg.Free(t.Context()))
}
