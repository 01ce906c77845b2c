package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

var soakFor = flag.Duration("chaos.soak", 60*time.Second, "TestSoak: how long the load runs")

// soakTiers are the tiers soak clients allocate from, at random.
var soakTiers = []alloc.Tier{alloc.TierCXL, alloc.TierLocal, alloc.TierRDMA}

// churn allocates a segment, writes it, reads it back, keeps it for a
// while and reads it again, then frees it (or, with keep, leaves it to the
// lease). A read that differs from the acknowledged write is reported.
func churn(ctx context.Context, c *alloc.Client, keep bool) error {
	tier := soakTiers[mrand.IntN(len(soakTiers))]
	size := int64(4096 * (1 + mrand.IntN(32)))
	seg, err := c.Alloc(ctx, size, alloc.WithTier(tier))
	if errors.Is(err, alloc.ErrNoCapacity) {
		return nil // many clients at once can fill a tier
	}
	if err != nil {
		return fmt.Errorf("alloc %d bytes on %s: %w", size, tier, err)
	}
	want := make([]byte, size)
	rand.Read(want)
	if _, err := seg.WriteAt(want, 0); err != nil {
		return fmt.Errorf("write segment %d: %w", seg.ID(), err)
	}
	got := make([]byte, size)
	for range 2 {
		if _, err := seg.ReadAt(got, 0); err != nil {
			return fmt.Errorf("read segment %d: %w", seg.ID(), err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("segment %d on %s: an acknowledged write is lost", seg.ID(), tier)
		}
		time.Sleep(time.Duration(mrand.IntN(20)) * time.Millisecond)
	}
	if keep {
		return nil
	}
	return seg.Free(ctx)
}

// roleSoak churns until killed, printing "ok <n>" every 20 rounds.
func roleSoak(ctx context.Context, c *alloc.Client) error {
	for i := 1; ; i++ {
		if err := churn(ctx, c, mrand.IntN(8) == 0); err != nil {
			return err
		}
		if i%20 == 0 {
			fmt.Println("ok", i)
		}
	}
}

// TestSoak runs, for -chaos.soak (60 s by default), four in-process
// clients that churn segments on every tier and drop their sessions every
// few rounds with segments still held, beside two client processes at a
// time that churn until they are killed with SIGKILL. Afterwards: no
// acknowledged write was lost (churn checks every segment it wrote),
// capacity is back to 100 % on every tier, and the daemon's goroutines and
// heap (from its /metrics) are flat: compared at two idle points, after a
// warm-up fifth of the run and at the end.
func TestSoak(t *testing.T) {
	metrics := freeAddr(t)
	n := newNode(t, "--lease-ttl", "1s", "--metrics", metrics)
	n.start(t)
	api := n.admin(t)
	var rounds, kills, drops atomic.Int64

	run := func(d time.Duration) {
		stop := make(chan struct{})
		time.AfterFunc(d, func() { close(stop) })
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for {
					c, err := alloc.Dial(t.Context(), n.sock, alloc.WithClientID(fmt.Sprintf("soak-%d-%d", w, drops.Add(1))))
					if err != nil {
						t.Errorf("dial: %v", err)
						return
					}
					for range 5 + mrand.IntN(20) {
						if err := churn(t.Context(), c, mrand.IntN(6) == 0); err != nil {
							t.Error(err)
						}
						rounds.Add(1)
					}
					c.Close() // the session drops with segments held: the lease reclaims them
					select {
					case <-stop:
						return
					default:
					}
				}
			})
		}
		for range 2 {
			wg.Go(func() {
				for {
					p := startRole(t, "soak", sockEnv+"="+n.sock)
					p.line(t, "ok ")
					select {
					case <-stop:
					case <-time.After(time.Duration(500+mrand.IntN(2000)) * time.Millisecond):
					}
					p.kill9()
					if s := p.out.String(); strings.Contains(s, "error: ") {
						t.Errorf("soak client: %s", s)
					}
					kills.Add(1)
					select {
					case <-stop:
						return
					default:
					}
				}
			})
		}
		wg.Wait()
	}

	// idle waits until every tier is whole again and samples the daemon.
	idle := func() (goroutines, heap float64) {
		deadline := time.Now().Add(time.Minute)
		for {
			st, err := api.Tiers(t.Context(), &poolv1.TiersRequest{})
			require.NoError(t, err)
			whole := true
			var saw []string
			for _, ti := range st.Tiers {
				if ti.Free != ti.Capacity {
					whole = false
					saw = append(saw, fmt.Sprintf("%s %d of %d free", ti.Tier, ti.Free, ti.Capacity))
				}
			}
			if whole {
				break
			}
			require.False(t, time.Now().After(deadline), "capacity not back to 100 %%: %s", strings.Join(saw, ", "))
			time.Sleep(100 * time.Millisecond)
		}
		list, err := api.List(t.Context(), &poolv1.ListRequest{})
		require.NoError(t, err)
		require.Empty(t, list.Segments)
		// Sessions of dropped clients end as their streams close.
		var m map[string]float64
		for range 50 {
			m = scrape(t, metrics)
			if m["farmem_sessions"] == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		return m["go_goroutines"], m["go_memstats_heap_inuse_bytes"]
	}

	run(*soakFor / 5)
	g0, h0 := idle()
	run(*soakFor - *soakFor/5)
	g1, h1 := idle()
	t.Logf("%d churn rounds, %d sessions dropped, %d client processes killed; goroutines %v -> %v, heap in use %.1f -> %.1f MiB",
		rounds.Load(), drops.Load(), kills.Load(), g0, g1, h0/(1<<20), h1/(1<<20))
	require.Positive(t, kills.Load())
	require.LessOrEqual(t, g1, g0+5, "poold's goroutines grew")
	require.LessOrEqual(t, h1, 1.5*h0+16<<20, "poold's heap grew")
}

// freeAddr is a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// scrape reads the unlabelled samples of a Prometheus text endpoint.
func scrape(t *testing.T, addr string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	require.NoError(t, sc.Err())
	return out
}
