package pool_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/pool"
)

// httpGet fetches url without keeping the connection (goleak).
func httpGet(t *testing.T, url string) (int, string, error) {
	t.Helper()
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// scrape fetches and parses a daemon's /metrics.
func scrape(t *testing.T, d *pool.Daemon) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := httpGet(t, "http://"+d.MetricsAddr()+"/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	return fams
}

// sample is the value of the one sample of fam whose labels include want
// (summed over samples that match, so partial label sets add up).
func sample(t *testing.T, fams map[string]*dto.MetricFamily, fam string, want map[string]string) float64 {
	t.Helper()
	f := fams[fam]
	require.NotNil(t, f, "family %s missing", fam)
	var sum float64
	found := false
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		found = true
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			sum += m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			sum += m.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	require.True(t, found, "no sample of %s with labels %v", fam, want)
	return sum
}

func TestMetrics(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Metrics = "127.0.0.1:0"
	d := pooltest.Start(t, cfg)
	require.NotEmpty(t, d.MetricsAddr())
	ctx := t.Context()

	c, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	defer c.Close()
	for _, tier := range []alloc.Tier{alloc.TierLocal, alloc.TierCXL} {
		seg, err := c.Alloc(ctx, 4096, alloc.WithTier(tier))
		require.NoError(t, err)
		require.NoError(t, seg.Free(ctx))
	}
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	require.Equal(t, alloc.TierRDMA, seg.Tier())
	buf := make([]byte, 4096)
	for i := range 10 {
		_, err = seg.WriteAt(buf, int64(i*len(buf)))
		require.NoError(t, err)
		_, err = seg.ReadAt(buf, int64(i*len(buf)))
		require.NoError(t, err)
	}
	_, err = seg.Add64(0, 1)
	require.NoError(t, err)
	_, err = seg.ReadAt(buf, seg.Size()) // refused by the client's own range check: no op served
	require.Error(t, err)
	_, err = c.Alloc(ctx, 1<<40, alloc.WithTier(alloc.TierLocal))
	require.ErrorIs(t, err, alloc.ErrNoCapacity)

	fams := scrape(t, d)
	families := map[string]dto.MetricType{
		"farmem_tier_capacity_bytes":                  dto.MetricType_GAUGE,
		"farmem_tier_used_bytes":                      dto.MetricType_GAUGE,
		"farmem_tier_free_bytes":                      dto.MetricType_GAUGE,
		"farmem_segments":                             dto.MetricType_GAUGE,
		"farmem_allocations_total":                    dto.MetricType_COUNTER,
		"farmem_frees_total":                          dto.MetricType_COUNTER,
		"farmem_reclaims_total":                       dto.MetricType_COUNTER,
		"farmem_alloc_failures_total":                 dto.MetricType_COUNTER,
		"farmem_lease_renewals_total":                 dto.MetricType_COUNTER,
		"farmem_lease_expiries_total":                 dto.MetricType_COUNTER,
		"farmem_sessions":                             dto.MetricType_GAUGE,
		"farmem_access_denied_total":                  dto.MetricType_COUNTER,
		"farmem_dataplane_operations_total":           dto.MetricType_COUNTER,
		"farmem_dataplane_bytes_total":                dto.MetricType_COUNTER,
		"farmem_dataplane_operation_duration_seconds": dto.MetricType_HISTOGRAM,
		"farmem_dataplane_errors_total":               dto.MetricType_COUNTER,
		"farmem_dataplane_refused_connections_total":  dto.MetricType_COUNTER,
		"farmem_cluster_members":                      dto.MetricType_GAUGE,
		"farmem_emulated_latency_seconds":             dto.MetricType_GAUGE,
		"farmem_metadata_commits_total":               dto.MetricType_COUNTER,
		"farmem_build_info":                           dto.MetricType_GAUGE,
		"go_goroutines":                               dto.MetricType_GAUGE,
	}
	for name, typ := range families {
		t.Run(name, func(t *testing.T) {
			f := fams[name]
			require.NotNil(t, f, "family missing from /metrics")
			require.Equal(t, typ, f.GetType())
			require.NotEmpty(t, f.GetHelp())
		})
	}

	t.Run("capacity is the configured sizes", func(t *testing.T) {
		for _, tt := range []struct {
			tier, device, emulated string
			size                   int64
		}{
			{"cxl", "emulated0", "true", int64(cfg.EmulateCXL)},
			{"local", "", "false", int64(cfg.LocalSize)},
			{"rdma", "export0", "true", int64(cfg.ExportSize)},
		} {
			labels := map[string]string{"tier": tt.tier, "emulated": tt.emulated}
			if tt.device != "" {
				labels["device"] = tt.device
			}
			capacity := sample(t, fams, "farmem_tier_capacity_bytes", labels)
			require.EqualValues(t, tt.size, capacity, tt.tier)
			used := sample(t, fams, "farmem_tier_used_bytes", labels)
			free := sample(t, fams, "farmem_tier_free_bytes", labels)
			require.Equal(t, capacity, used+free, tt.tier)
		}
		require.Positive(t, sample(t, fams, "farmem_tier_used_bytes", map[string]string{"tier": "rdma"}), "the rdma segment is still held")
	})
	t.Run("counters moved", func(t *testing.T) {
		for _, tier := range []string{"local", "cxl", "rdma"} {
			require.GreaterOrEqual(t, sample(t, fams, "farmem_allocations_total", map[string]string{"tier": tier}), 1.0, tier)
		}
		require.GreaterOrEqual(t, sample(t, fams, "farmem_frees_total", map[string]string{"tier": "local"}), 1.0)
		require.GreaterOrEqual(t, sample(t, fams, "farmem_alloc_failures_total", map[string]string{"reason": "no_capacity"}), 1.0)
		require.Equal(t, 1.0, sample(t, fams, "farmem_segments", map[string]string{"tier": "rdma", "state": "active"}))
		require.Equal(t, 0.0, sample(t, fams, "farmem_segments", map[string]string{"tier": "local", "state": "active"}))
		require.GreaterOrEqual(t, sample(t, fams, "farmem_sessions", nil), 1.0)
		require.Equal(t, 1.0, sample(t, fams, "farmem_build_info", map[string]string{"version": pool.Version}))
		require.Equal(t, 1.0, sample(t, fams, "farmem_cluster_members", map[string]string{"state": "alive"}))
		require.Equal(t, 0.0, sample(t, fams, "farmem_emulated_latency_seconds", map[string]string{"tier": "cxl"}))
	})
	t.Run("data plane", func(t *testing.T) {
		// The server counts an op after queueing its response; the client
		// may have its answer a moment before: scrape until the counts land.
		var reads, writes, readBytes, fadds, durations float64
		require.Eventually(t, func() bool {
			fams := scrape(t, d)
			reads = sample(t, fams, "farmem_dataplane_operations_total", map[string]string{"op": "read", "tier": "rdma"})
			writes = sample(t, fams, "farmem_dataplane_operations_total", map[string]string{"op": "write", "tier": "rdma"})
			fadds = sample(t, fams, "farmem_dataplane_operations_total", map[string]string{"op": "fadd", "tier": "rdma"})
			readBytes = sample(t, fams, "farmem_dataplane_bytes_total", map[string]string{"op": "read", "tier": "rdma"})
			durations = sample(t, fams, "farmem_dataplane_operation_duration_seconds", map[string]string{"op": "read", "tier": "rdma"})
			return reads >= 10 && writes >= 10 && fadds >= 1 && durations >= 10
		}, 10*time.Second, 10*time.Millisecond, "reads %v writes %v fadds %v", reads, writes, fadds)
		require.GreaterOrEqual(t, readBytes, 10*4096.0)
	})
	t.Run("leases", func(t *testing.T) {
		// A second client allocates and goes away without freeing: its
		// lease (1s) runs out and the reaper reclaims the segment.
		c2, err := alloc.Dial(ctx, cfg.Socket, alloc.WithClientID("metrics-test-leaver"))
		require.NoError(t, err)
		_, err = c2.Alloc(ctx, 4096, alloc.WithTier(alloc.TierLocal))
		require.NoError(t, err)
		require.NoError(t, c2.Close())
		require.Eventually(t, func() bool {
			fams := scrape(t, d)
			return sample(t, fams, "farmem_lease_expiries_total", nil) >= 1 &&
				sample(t, fams, "farmem_reclaims_total", map[string]string{"reason": "lease_expired"}) >= 1 &&
				sample(t, fams, "farmem_lease_renewals_total", nil) >= 1
		}, 20*time.Second, 50*time.Millisecond)
	})
	require.NoError(t, seg.Free(ctx))
}

func TestHealth(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Metrics = "127.0.0.1:0"
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	d, err := pool.New(cfg, nil)
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			d.Close()
		}
	})
	base := "http://" + d.MetricsAddr()

	code, _, err := httpGet(t, base+"/healthz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, body, err := httpGet(t, base+"/readyz")
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, "before Serve: %s", body)
	require.Contains(t, body, "FAIL serving")

	var served sync.WaitGroup
	served.Add(1)
	go func() {
		defer served.Done()
		if err := d.Serve(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	require.Eventually(t, func() bool {
		code, _, err := httpGet(t, base+"/readyz")
		return err == nil && code == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)

	probeTLS := pooltest.ClientTLS(t, "probe")
	channels := map[string][2]string{"unix socket": {"unix", cfg.Socket}, "tcp": {"tcp", d.ListenAddr()}}
	for name, target := range channels {
		t.Run(name, func(t *testing.T) {
			var tc *tls.Config
			if target[0] == "tcp" {
				tc = probeTLS
			}
			conn, err := session.ChannelTLS(target[0], target[1], tc)
			require.NoError(t, err)
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			for _, svc := range []string{"", "farmem.pool.v1.Pool"} {
				resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
				require.NoError(t, err, "service %q", svc)
				require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.Status, "service %q", svc)
			}
			_, err = hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "no.such.Service"})
			require.Error(t, err)
		})
	}

	// A watcher on the unix socket sees NOT_SERVING as soon as Close
	// begins, while the daemon drains its calls. (The TCP control plane
	// stops at once, without draining.)
	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	first, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, first.Status)
	closeErr := make(chan error, 1)
	go func() { closeErr <- d.Close() }()
	next, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next.Status)
	cancel() // lets the graceful stop finish
	require.NoError(t, <-closeErr)
	closed = true
	served.Wait()

	_, _, err = httpGet(t, base+"/readyz")
	require.Error(t, err, "the endpoints are gone after Close")
	uconn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err) // dialing is lazy
	defer uconn.Close()
	ctx, cancelCheck := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancelCheck()
	_, err = healthpb.NewHealthClient(uconn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Error(t, err, "no health service after Close")
}

func TestMetricsAddrInUse(t *testing.T) {
	first := pooltest.Config(t)
	first.Metrics = "127.0.0.1:0"
	d := pooltest.Start(t, first)
	second := pooltest.Config(t)
	second.Metrics = d.MetricsAddr()
	_, err := pool.New(second, nil)
	require.ErrorContains(t, err, fmt.Sprintf("metrics on %s", d.MetricsAddr()))
	// The failed daemon released what it took: its socket can be used.
	second.Metrics = ""
	pooltest.Start(t, second)
}
