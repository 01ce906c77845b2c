package pool_test

import (
	"bytes"
	"log/slog"

	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
	"github.com/farmem/farmem/internal/uevent"
	"github.com/farmem/farmem/pool"
)

// daxEvent is the event of a dax device going (remove) or coming (add).
func daxEvent(action string) []byte {
	return uevent.Event{Action: action, DevPath: "/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0", Subsystem: "dax"}.Bytes()
}

// cxlTier is the cxl tier as the daemon shows it.
func cxlTier(t *testing.T, c *alloc.Client) alloc.TierInfo {
	tiers, err := c.Tiers(t.Context())
	require.NoError(t, err)
	for _, ti := range tiers {
		if ti.Tier == alloc.TierCXL {
			return ti
		}
	}
	return alloc.TierInfo{}
}

// cxlDevices are the devices of the cxl tier as the daemon lists them.
func cxlDevices(t *testing.T, c *alloc.Client) []string { return cxlTier(t, c).Devices }

// hotplugConfig is a daemon on a switchable sysfs root that starts without
// CXL memory (the plain tree), with the devdax fixture's device ready to be
// opened (a stand-in file) once the tree shows it.
func hotplugConfig(t *testing.T) (pool.Config, *testfs.SysfsSwitch, func([]byte)) {
	cfg := pool.DefaultConfig()
	cfg.Node = "n1"
	cfg.DataDir = t.TempDir()
	cfg.ShmDir = filepath.Join(cfg.DataDir, "shm")
	cfg.Socket = pooltest.SocketPath(t)
	cfg.EmulateCXL, cfg.LocalSize, cfg.ExportSize = 16*size.MiB, 16*size.MiB, 0
	cfg.MeasureTiers = false
	cfg.AllowDevdaxFD = true
	cfg.DevRoot = t.TempDir()
	testfs.DevdaxStandIns(t, "../cxl/testdata/devdax", cfg.DevRoot)
	sys := testfs.NewSysfsSwitch(t, "plain")
	cfg.SysfsRoot = sys.Root()
	send := pool.FeedUevents(&cfg)
	return cfg, sys, send
}

// TestHotplugDevdax: a devdax device that appears in the sysfs tree after
// start, announced by a uevent, becomes a device of the cxl tier that new
// segments go to (ahead of the emulated device); when it goes, placements
// stop reaching it, and its segment is reported lost to its client, whose
// calls on it then fail with ErrSegmentLost, as does opening it again.
func TestHotplugDevdax(t *testing.T) {
	cfg, sys, send := hotplugConfig(t)
	cfg.MeasureTiers = true // the 16 MiB devices are too small to measure; dax0.0 is not
	pooltest.Start(t, cfg)
	c, err := alloc.Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, []string{"emulated0"}, cxlDevices(t, c))

	sys.Set("devdax")
	send(daxEvent("add"))
	require.Eventually(t, func() bool { return len(cxlDevices(t, c)) == 2 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"dax0.0", "emulated0"}, cxlDevices(t, c))
	// The tier is measured again, now on its first device.
	require.Eventually(t, func() bool { return cxlTier(t, c).ReadLatency.Source == "measured" }, 30*time.Second, 50*time.Millisecond)
	seg, err := c.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierCXL), alloc.WithPersist())
	require.NoError(t, err)
	require.Equal(t, "dax0.0", seg.Device())
	_, err = seg.WriteAt([]byte("on dax"), 0)
	require.NoError(t, err)

	sys.Set("plain")
	send(daxEvent("remove"))
	require.Eventually(t, func() bool {
		_, err := seg.ReadAt(make([]byte, 6), 0)
		return err != nil
	}, 10*time.Second, 20*time.Millisecond, "the client is told its segment is lost")
	_, err = seg.ReadAt(make([]byte, 6), 0)
	require.ErrorIs(t, err, alloc.ErrSegmentLost)
	require.ErrorIs(t, seg.Store64(0, 1), alloc.ErrSegmentLost)
	require.Equal(t, []string{"emulated0"}, cxlDevices(t, c))
	require.Zero(t, cxlTier(t, c).ReadLatency, "no figure left from the device that went (emulated0 is too small to measure)")
	_, err = c.Open(t.Context(), seg.ID())
	require.ErrorIs(t, err, alloc.ErrSegmentLost)
	next, err := c.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	require.Equal(t, "emulated0", next.Device())
	require.NoError(t, next.Free(t.Context()))
	require.NoError(t, seg.Free(t.Context()), "a lost segment can be freed")

	// It comes back: placed on again; the lost segment's record is gone
	// with its free, so all of it is free.
	sys.Set("devdax")
	send(daxEvent("add"))
	require.Eventually(t, func() bool { return len(cxlDevices(t, c)) == 2 }, 10*time.Second, 20*time.Millisecond)
	again, err := c.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	require.Equal(t, "dax0.0", again.Device())
	require.NoError(t, again.Free(t.Context()))
}

// logCount counts log records whose message holds a string; safe for
// concurrent use.
type logCount struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCount) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logCount) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// TestHotplugFloodAndChurn: a flood of events costs a rescan per 200 ms,
// not one each; events of other subsystems and garbage cost none; and a
// tree that changes while it is read (switched between two trees many
// times, mid-scan) makes no panic and, once it settles, the devices match
// it: no device left over from a tree that went.
func TestHotplugFloodAndChurn(t *testing.T) {
	cfg, sys, send := hotplugConfig(t)
	var logs logCount
	d, err := pool.Start(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	c, err := alloc.Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	defer c.Close()

	for range 50 {
		send(uevent.Event{Action: "add", DevPath: "/devices/virtual/net/veth0", Subsystem: "net"}.Bytes())
		send([]byte("garbage"))
	}
	start := time.Now()
	for range 2000 {
		send(uevent.Event{Action: "online", DevPath: "/devices/system/memory/memory40", Subsystem: "memory"}.Bytes())
	}
	sent := time.Since(start)
	require.Eventually(t, func() bool { return logs.count("memory devices rescanned") > 0 }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	// Each rescan gathers 200 ms of events: at most one per 200 ms of
	// sending, plus the one after the last.
	rescans := logs.count("memory devices rescanned")
	t.Logf("2000 events in %v: %d rescans", sent, rescans)
	require.LessOrEqual(t, rescans, int(sent/(200*time.Millisecond))+2, "2000 events took %v to send", sent)

	// Switch the tree without pause for a second and a half: the rescans
	// meanwhile (one per 200 ms) read it while it changes.
	before := logs.count("memory devices rescanned")
	churn := time.Now()
	for i := 0; time.Since(churn) < 1500*time.Millisecond; i++ {
		sys.Set([]string{"devdax", "plain"}[i%2])
		send(daxEvent([]string{"add", "remove"}[i%2]))
	}
	require.GreaterOrEqual(t, logs.count("memory devices rescanned")-before, 3, "rescans while the tree changed")
	sys.Set("devdax")
	send(daxEvent("add"))
	require.Eventually(t, func() bool { return len(cxlDevices(t, c)) == 2 }, 10*time.Second, 20*time.Millisecond)
	sys.Set("plain")
	send(daxEvent("remove"))
	require.Eventually(t, func() bool { return len(cxlDevices(t, c)) == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"emulated0"}, cxlDevices(t, c))
	t.Logf("%d rescans in all, %d read a tree with problems", logs.count("memory devices rescanned"), logs.count("memory devices rescanned")-logs.count("problems=0"))
}
