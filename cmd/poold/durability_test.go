package main

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/testfs"
)

// TestMetadataDurabilityClasses runs poold on the lab guest's sysfs tree,
// whose dax0.0 is persistent memory (a pmem region; a regular file stands
// in for /dev/dax0.0), beside local DRAM and the loopback rdma tier, which
// are volatile. Volatile segments' allocations and frees commit to
// segments-volatile.db without an fsync, never to segments.db; a segment
// on dax0.0 commits to segments.db with one (farmem_metadata_commits_total
// by file and fsync). After kill -9 and a restart every record is back:
// the same ids, names, owners and devices, the DRAM ones lost (their
// memfds died with poold), the others active.
func TestMetadataDurabilityClasses(t *testing.T) {
	const sysfs = "../../cxl/testdata/qemu-devdax"
	data, sock, devRoot := t.TempDir(), filepath.Join(shortDir(t), "p.sock"), t.TempDir()
	testfs.DevdaxStandIns(t, sysfs, devRoot)
	metrics := freeAddr(t, "tcp")
	args := []string{"--sysfs-root", sysfs, "--dev-root", devRoot, "--allow-devdax-fd", "--metrics", metrics,
		"--data-listen", freeAddr(t, "tcp"), "--export-size", "16MiB"}
	d := startDaemon(t, data, sock, args...)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, sock, alloc.WithClientID("durability-app"))
	require.NoError(t, err)
	defer c.Close()
	// The first allocation reserves a block of ids in segments.db.
	seg, err := c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierLocal))
	require.NoError(t, err)
	require.NoError(t, seg.Free(ctx))

	const durable, volatile = `file="segments.db",fsync="true"`, `file="segments-volatile.db",fsync="false"`
	before := commitCounts(t, metrics)
	for i, tier := range []alloc.Tier{alloc.TierLocal, alloc.TierLocal, alloc.TierRDMA, alloc.TierRDMA} {
		// Named, persistent, unnamed, and one allocated and freed.
		for j, opt := range []alloc.AllocOption{alloc.WithName("v" + strconv.Itoa(i)), alloc.WithPersist(), alloc.WithTier(tier), alloc.WithTier(tier)} {
			seg, err := c.Alloc(ctx, 64<<10, alloc.WithTier(tier), opt)
			require.NoError(t, err)
			if j == 3 {
				require.NoError(t, seg.Free(ctx))
			}
		}
	}
	mid := commitCounts(t, metrics)
	require.Equal(t, before[durable], mid[durable], "volatile segments' changes are not fsynced: %v", mid)
	require.GreaterOrEqual(t, mid[volatile], before[volatile]+20, "16 allocations and 4 frees, one after another, commit to the volatile file: %v", mid)

	for _, opt := range []alloc.AllocOption{alloc.WithName("pmem"), alloc.WithPersist()} {
		_, err := c.Alloc(ctx, 64<<10, alloc.WithTier(alloc.TierCXL), opt)
		require.NoError(t, err)
	}
	after := commitCounts(t, metrics)
	require.Equal(t, mid[durable]+2, after[durable], "each persistent-memory allocation is an fsynced commit: %v", after)

	list := segmentRows(t, sock)
	devices := map[string]int{}
	for _, s := range list {
		devices[s.Device]++
		require.Equal(t, "active", s.State)
		require.Equal(t, "durability-app", s.Owner)
	}
	require.Equal(t, map[string]int{"dram": 6, "export0": 6, "dax0.0": 2}, devices)

	d.kill9(t)
	startDaemon(t, data, sock, args...)
	back := segmentRows(t, sock)
	require.Len(t, back, len(list))
	for i, s := range list {
		if s.Device == "dram" {
			s.State = "lost"
		}
		require.Equal(t, s, back[i], "segment %d after kill -9 and a restart", s.ID)
	}
}

// segmentRow is what TestMetadataDurabilityClasses compares of a segment
// in memctl segments -o json.
type segmentRow struct {
	ID     uint64 `json:"id"`
	Name   string `json:"name"`
	Owner  string `json:"owner"`
	Device string `json:"device"`
	State  string `json:"state"`
}

func segmentRows(t *testing.T, sock string) []segmentRow {
	out, err := memctlCommand(t.Context(), "--socket", sock, "segments", "-o", "json").Output()
	require.NoError(t, err)
	var rows []segmentRow
	require.NoError(t, json.Unmarshal(out, &rows), "%s", out)
	return rows
}

// commitCounts reads farmem_metadata_commits_total from poold's /metrics at
// addr, by its labels as the text format writes them.
func commitCounts(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	var code int
	var body string
	require.Eventually(t, func() bool { code, body = httpGet(addr, "/metrics"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	out := map[string]float64{}
	for line := range strings.Lines(body) {
		rest, ok := strings.CutPrefix(line, "farmem_metadata_commits_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		require.True(t, ok, line)
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		require.NoError(t, err, line)
		out[labels] = v
	}
	require.Len(t, out, 2, "a sample for each file: %s", body)
	return out
}
