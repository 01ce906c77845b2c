package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
)

// TestMain checks that no goroutine outlives the tests. memberlist's
// Shutdown does not wait for a probe in flight (see internal/cluster's
// TestMain): after the scale simulation's hundreds of daemons, such
// goroutines end within a probe interval times Lifeguard's awareness
// multiplier, so they get a bounded grace period before goleak decides.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(15 * time.Second)
		for goleak.Find() != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines still running 15 s after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.Node = "n1"
	cfg.DataDir = t.TempDir()
	cfg.SysfsRoot = "../cxl/testdata/plain"
	cfg.ShmDir = filepath.Join(cfg.DataDir, "shm")
	cfg.EmulateCXL = 16 * size.MiB
	cfg.LocalSize = 16 * size.MiB
	cfg.LeaseTTL = 200 * time.Millisecond
	cfg.ExportSize = 0
	cfg.MeasureTiers = false
	dir, err := os.MkdirTemp("", "fm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.Socket = filepath.Join(dir, "p.sock")
	return cfg
}

func newTestPool(t testing.TB, cfg Config) *core {
	_, devs, err := discover(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	p, err := newCore(cfg, slog.New(slog.DiscardHandler), devs, nil, nil)
	require.NoError(t, err)
	return p
}

func admin() caller { return caller{} }

// clockedPool is a test pool whose clock stands still at *now until the
// test moves it; the pool closes with the test.
func clockedPool(t *testing.T) (Config, *core, *time.Time) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	return cfg, p, &now
}

func TestRestartKeepsSegments(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	cxlSeg, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 5000, Tier: poolv1.Tier_TIER_CXL, Name: "a"})
	require.NoError(t, err)
	localSeg, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Persist: true})
	require.NoError(t, err)
	b, err := p.Backing(admin(), cxlSeg.ID)
	require.NoError(t, err)
	_, err = b.File.WriteAt([]byte("survives"), b.Offset+100)
	require.NoError(t, err)
	b.File.Close()
	require.NoError(t, p.close())
	require.NoError(t, p.close(), "close is idempotent")

	p = newTestPool(t, cfg)
	defer p.close()
	got := p.List()
	require.Len(t, got, 2)
	require.Equal(t, "a", got[0].Name)
	require.False(t, got[0].Lost)
	require.True(t, got[1].Lost, "local DRAM does not survive a restart")
	b, err = p.Backing(admin(), cxlSeg.ID)
	require.NoError(t, err)
	buf := make([]byte, 8)
	_, err = b.File.ReadAt(buf, b.Offset+100)
	require.NoError(t, err)
	require.Equal(t, "survives", string(buf))
	b.File.Close()
	_, err = p.Backing(admin(), localSeg.ID)
	require.ErrorIs(t, err, errs.ErrSegmentLost)

	// The extents are reserved again: new segments do not overlap them, and ids are not reused.
	n, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	require.Greater(t, n.ID, localSeg.ID)
	require.GreaterOrEqual(t, n.Offset, cxlSeg.Offset+cxlSeg.Extent)

	// Freeing everything gives all capacity back.
	for _, r := range p.List() {
		require.NoError(t, p.Free(admin(), r.ID, ""))
	}
	for _, ti := range p.tiers() {
		require.Equal(t, ti.Capacity, ti.Free, ti.Tier.String())
	}
}

func TestLeaseReap(t *testing.T) {
	cfg, p, now := clockedPool(t)
	c := sessionCaller(t, p, "s1", "app", 1, 0)
	unnamed, err := p.Alloc(t.Context(), c, allocRequest{Size: 1 << 20})
	require.NoError(t, err)
	_, err = p.Alloc(t.Context(), c, allocRequest{Size: 1 << 20, Name: "kept"})
	require.NoError(t, err)

	p.closeSession("s1")
	*now = now.Add(cfg.LeaseTTL - time.Millisecond)
	p.reap()
	require.Len(t, p.List(), 2, "within the TTL nothing is reclaimed")

	// The client comes back with the same identity, then leaves again.
	p.openSession("s2", "app", "", "app", 2, 0)
	*now = now.Add(time.Hour)
	p.reap()
	require.Len(t, p.List(), 2, "a live session holds the lease")
	p.closeSession("s2")
	*now = now.Add(cfg.LeaseTTL)
	p.reap()
	got := p.List()
	require.Len(t, got, 1)
	require.Equal(t, "kept", got[0].Name)

	_, err = p.callerFor("s1")
	require.ErrorIs(t, err, errs.ErrLeaseExpired)

	// The client's next session is told which segments went (in its
	// Welcome); the one after it is not told again, nor is a session of
	// another identity that took the id.
	_, reclaimed := p.openSession("s3", "app", "", "app", 3, 0)
	require.Equal(t, []uint64{unnamed.ID}, reclaimed)
	_, reclaimed = p.openSession("s4", "app", "", "app", 4, 0)
	require.Empty(t, reclaimed)
	p.unreclaimedTold("app", "", []uint64{unnamed.ID}) // s4's Welcome was not sent
	_, reclaimed = p.openSession("s5", "app", "cn:other", "app", 5, 0)
	require.Empty(t, reclaimed, "another identity is not told")
	p.unreclaimedTold("app", "", []uint64{unnamed.ID})
	_, reclaimed = p.openSession("s6", "app", "", "app", 6, 0)
	require.Equal(t, []uint64{unnamed.ID}, reclaimed, "a notice whose Welcome was not sent is told next time")
}

// TestReapCommitsOnce: the reap of a client whose lease ran out removes
// its segments from the metadata store in one commit, and ends its
// attachments in another, not one each under the daemon's lock.
func TestReapCommitsOnce(t *testing.T) {
	cfg, p, now := clockedPool(t)
	c := identCaller(t, p, "app", "uid:1000")
	const n = 40
	for range n {
		_, err := p.Alloc(t.Context(), c, allocRequest{Size: 64 << 10, Tier: poolv1.Tier_TIER_LOCAL})
		require.NoError(t, err)
	}
	// It attached ten named segments of another client's.
	o := identCaller(t, p, "other", "uid:1000")
	for i := range 10 {
		name := fmt.Sprintf("shared-%d", i)
		_, err := p.Alloc(t.Context(), o, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Name: name})
		require.NoError(t, err)
		_, err = p.Attach(c, name)
		require.NoError(t, err)
	}
	commits := func() (k uint64) {
		for _, f := range p.st.files() {
			k += f.commits.Load()
		}
		return k
	}
	p.closeSession("s-app")
	*now = now.Add(cfg.LeaseTTL)
	before := commits()
	p.reap()
	left := p.List()
	require.Len(t, left, 10, "the named segments stay")
	for _, r := range left {
		require.Empty(t, r.Attached, "the attachments ended")
	}
	require.LessOrEqual(t, commits()-before, uint64((n+reclaimBatch-1)/reclaimBatch+2), "a commit for every %d of the %d segments, one for the 10 attachments (and one for the client's binding)", reclaimBatch, n)
}

// TestReapCommitFails: a reap whose second removal commit fails leaves
// the segments it did not remove in the table and the store, the client
// expired, and the next sweep removes them; the client is told of all.
func TestReapCommitFails(t *testing.T) {
	cfg, p, now := clockedPool(t)
	c := sessionCaller(t, p, "s1", "app", 1, 0)
	n := reclaimBatch + 8
	var ids []uint64
	var f *storeFile
	for range n {
		r, err := p.Alloc(t.Context(), c, allocRequest{Size: 64 << 10, Tier: poolv1.Tier_TIER_LOCAL})
		require.NoError(t, err)
		ids = append(ids, r.ID)
		f = p.st.fileFor(r)
	}
	removals := 0
	f.inject = func(removal bool) error {
		if removal {
			if removals++; removals > 1 {
				return errors.New("the test refuses this commit")
			}
		}
		return nil
	}
	p.closeSession("s1")
	*now = now.Add(cfg.LeaseTTL)
	p.reap()
	require.Len(t, p.List(), 8, "the first commit's segments went, the failed one's stayed")
	loaded, _, err := f.load()
	require.NoError(t, err)
	require.Len(t, loaded, 8, "the store holds what the table holds")
	f.inject = nil
	p.reap()
	require.Empty(t, p.List(), "the next sweep removed the rest")
	_, told := p.openSession("s2", "app", "", "app", 2, 0)
	require.ElementsMatch(t, ids, told, "the client is told of every segment reclaimed, over both sweeps")
}

// TestReclaimNotices checks the bounds of what a lease's expiry leaves for
// the client's next session: the oldest notices go first past
// maxReclaimedIDs, maxReclaimedClients or maxReclaimedAge, one notice
// alone keeps its newest ids, and a notice is given only to the identity
// its segments were reclaimed under.
func TestReclaimNotices(t *testing.T) {
	var n reclaimNotices
	now := time.Unix(1000, 0)
	ids := func(from, k int) []uint64 {
		out := make([]uint64, k)
		for i := range out {
			out[i] = uint64(from + i)
		}
		return out
	}
	n.add("a", "uid:1", ids(1, 10), now)
	n.add("b", "uid:2", ids(100, maxReclaimedIDs-20), now)
	n.add("c", "uid:3", ids(900000, 10), now)
	require.Equal(t, maxReclaimedIDs, n.total)
	n.add("c", "uid:3", ids(900010, 1), now)
	require.Nil(t, n.take("a", "uid:1", now), "the oldest notice went past the bound on ids")
	require.Equal(t, ids(900000, 11), n.take("c", "uid:3", now), "a notice grows while its client stays away")
	require.Nil(t, n.take("b", "uid:9", now), "another identity that took the client id is not told")
	require.Nil(t, n.take("b", "uid:2", now), "a notice is given once, to whoever opens the next session")
	require.Zero(t, n.total)
	require.Zero(t, n.order.Len())

	n.add("d", "uid:4", ids(1, maxReclaimedIDs+5), now)
	require.Equal(t, ids(6, maxReclaimedIDs), n.take("d", "uid:4", now), "one notice alone keeps its newest ids")

	n.add("e", "uid:5", ids(1, 3), now)
	n.add("e", "uid:6", ids(7, 2), now)
	require.Equal(t, ids(7, 2), n.take("e", "uid:6", now), "a notice under another identity replaces the old one")
	require.Zero(t, n.total)

	for i := range maxReclaimedClients + 1 {
		n.add(fmt.Sprintf("client-%d", i), "uid:7", ids(i, 1), now)
	}
	require.Equal(t, maxReclaimedClients, n.order.Len(), "past the bound on clients")
	require.Nil(t, n.take("client-0", "uid:7", now), "the oldest client's notice went")
	require.Equal(t, ids(1, 1), n.take("client-1", "uid:7", now))

	later := now.Add(maxReclaimedAge)
	require.Nil(t, n.take("client-2", "uid:7", later), "a notice older than maxReclaimedAge is not told")
	n.add("f", "uid:8", ids(5, 1), later)
	require.Equal(t, 1, n.order.Len(), "the notices older than maxReclaimedAge went")
	require.Equal(t, 1, n.total)
}

func TestDevdaxFromFixture(t *testing.T) {
	cfg := testConfig(t)
	cfg.SysfsRoot = "../cxl/testdata/devdax"
	cfg.DevRoot = t.TempDir()
	dx := testfs.DevdaxStandIns(t, cfg.SysfsRoot, cfg.DevRoot)[0]

	t.Run("not handed out by default", func(t *testing.T) {
		p := newTestPool(t, cfg)
		defer p.close()
		tiers := p.tiers()
		require.Equal(t, poolv1.Tier_TIER_CXL, tiers[0].Tier)
		require.Equal(t, "devdax", tiers[0].Kind)
		require.False(t, tiers[0].Emulated)
		require.Zero(t, tiers[0].Free)
		require.Contains(t, tiers[0].Note, "--allow-devdax-fd")
		_, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
		require.ErrorIs(t, err, errs.ErrNoCapacity)
		require.Contains(t, err.Error(), "--allow-devdax-fd")
	})
	t.Run("allowed", func(t *testing.T) {
		cfg := cfg
		cfg.AllowDevdaxFD = true
		p := newTestPool(t, cfg)
		defer p.close()
		r, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
		require.NoError(t, err)
		require.Equal(t, dx.Name, r.Device)
		require.Zero(t, r.Offset%int64(dx.Align))
		b, err := p.Backing(admin(), r.ID)
		require.NoError(t, err)
		b.File.Close()
	})
}

// TestRecordDurabilityFollowsDevice: a segment on persistent memory (a
// pmem region's devdax device) has its record fsynced, one on a ram
// region's devdax device or on local DRAM in the volatile file, and each
// comes back from its file after a restart.
func TestRecordDurabilityFollowsDevice(t *testing.T) {
	for _, tc := range []struct {
		fixture  string
		volatile bool
	}{{"devdax", true}, {"qemu-devdax", false}} {
		t.Run(tc.fixture, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.SysfsRoot = filepath.Join("../cxl/testdata", tc.fixture)
			cfg.DevRoot = t.TempDir()
			cfg.AllowDevdaxFD = true
			testfs.DevdaxStandIns(t, cfg.SysfsRoot, cfg.DevRoot)
			p := newTestPool(t, cfg)
			cxlSeg, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
			require.NoError(t, err)
			require.Equal(t, "dax0.0", cxlSeg.Device)
			require.Equal(t, tc.volatile, cxlSeg.Volatile)
			local, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Persist: true})
			require.NoError(t, err)
			require.True(t, local.Volatile)
			require.NoError(t, p.close())

			p = newTestPool(t, cfg)
			defer p.close()
			for _, want := range []*record{cxlSeg, local} {
				got, err := p.Stat(want.ID)
				require.NoError(t, err)
				require.Equal(t, want.Volatile, got.Volatile, "segment %d on %s", want.ID, want.Device)
			}
		})
	}
}

// TestEmulatedRecordDurabilityFollowsFilesystem: an emulated CXL
// device's segment records are volatile where its files are memory (tmpfs,
// hugetlbfs: gone at a reboot) and fsynced where its files are on a disk
// filesystem, which keeps them across a reboot; each comes back from its
// file after a restart.
func TestEmulatedRecordDurabilityFollowsFilesystem(t *testing.T) {
	dirs := map[string]string{"temp": t.TempDir()}
	if shm, err := os.MkdirTemp("/dev/shm", "fm-emu"); err == nil {
		t.Cleanup(func() { os.RemoveAll(shm) })
		dirs["shm"] = shm
	}
	for name, dir := range dirs {
		t.Run(name, func(t *testing.T) {
			var st unix.Statfs_t
			require.NoError(t, unix.Statfs(dir, &st))
			memory := st.Type == unix.TMPFS_MAGIC || st.Type == unix.HUGETLBFS_MAGIC
			cfg := testConfig(t)
			cfg.EmulateDir = dir
			p := newTestPool(t, cfg)
			seg, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
			require.NoError(t, err)
			require.Equal(t, "emulated0", seg.Device)
			require.Equal(t, memory, seg.Volatile, "files in %s (filesystem magic %#x)", dir, st.Type)
			require.NoError(t, p.close())

			p = newTestPool(t, cfg)
			defer p.close()
			got, err := p.Stat(seg.ID)
			require.NoError(t, err)
			require.Equal(t, memory, got.Volatile)
		})
	}
}

func TestConfigFile(t *testing.T) {
	base := DefaultConfig()
	c, err := ParseConfig([]byte("emulate-cxl: 2GiB\nlease-ttl: 3s\nnode: x\nallow-devdax-fd: true\n"), base)
	require.NoError(t, err)
	require.Equal(t, 2*size.GiB, c.EmulateCXL)
	require.Equal(t, 3*time.Second, c.LeaseTTL)
	require.Equal(t, "x", c.Node)
	require.True(t, c.AllowDevdaxFD)
	require.Equal(t, base.LocalSize, c.LocalSize, "keys not in the file keep their value")

	c, err = ParseConfig(nil, base)
	require.NoError(t, err)
	require.Equal(t, base, c)

	for _, tc := range []struct{ in, want string }{
		{"emulate-cxll: 1GiB\n", "line 1: unknown key emulate-cxll; did you mean emulate-cxl?"},
		{"node: a\nlocal-sise: 1GiB\n", "line 2: unknown key local-sise; did you mean local-size?"},
		{"sockett: /x\n", "unknown key sockett; did you mean socket?"},
		{"colour: blue\n", "unknown key colour (the keys are poold's flag names: see poold --help)"},
		{"emulate-cxl: lots\n", `line 1: emulate-cxl: "lots": not a byte size: write a whole number with an optional unit`},
		{"lease-ttl: 10\n", `line 1: lease-ttl: write a duration like 10s or 500ms, not "10"`},
		{"lease-ttl: forever\n", `lease-ttl: write a duration like 10s or 500ms, not "forever"`},
		{"allow-devdax-fd: maybe\n", `allow-devdax-fd: write true or false, not "maybe"`},
		{"max-name-len: ten\n", `max-name-len: write a whole number, not "ten"`},
		{"node: [a, b]\n", "node: write one value, not a list"},
		{"join: 10.0.0.1:7946\n", "join: write a list like [a, b]"},
		{"allow-uids: [root]\n", "allow-uids: write a list of numeric ids like [0, 1000]"},
		{"quotas: 1GiB\n", "quotas: write identities with a size per tier"},
		{"node: a\nnode: b\n", "line 2: key node again (first on line 1); give each key once"},
		{"- a\n- b\n", "line 1: the file must map keys to values"},
		{"node: [1, 2\n", "yaml: line 1"},
	} {
		c, err := ParseConfig([]byte(tc.in), base)
		require.ErrorIs(t, err, ErrConfig, tc.in)
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), "pool.Config", "no Go types in messages")
		require.NotContains(t, err.Error(), "unmarshal")
		require.Equal(t, base, c)
	}
	_, err = LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"), base)
	require.ErrorIs(t, err, ErrConfig)
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"empty node", func(c *Config) { c.Node = "" }, "node"},
		{"long socket", func(c *Config) { c.Socket = "/" + strings.Repeat("s", 120) }, "socket"},
		{"negative", func(c *Config) { c.EmulateCXL = -1 }, "emulate-cxl"},
		{"short ttl", func(c *Config) { c.LeaseTTL = time.Millisecond }, "lease-ttl"},
		{"short peer ttl", func(c *Config) { c.PeerLeaseTTL = time.Millisecond }, "peer-lease-ttl"},
		{"negative peer probe period", func(c *Config) { c.MeasurePeersEvery = -time.Second }, "measure-peers-every"},
		{"peer probe period below a second", func(c *Config) { c.MeasurePeersEvery = time.Millisecond }, "measure-peers-every"},
		{"log level", func(c *Config) { c.LogLevel = "loud" }, "log-level"},
		{"log format", func(c *Config) { c.LogFormat = "xml" }, "log-format"},
		{"gossip with TLS and no key", func(c *Config) {
			c.Gossip, c.Listen, c.TLSCert, c.TLSKey, c.TLSCA = "127.0.0.1:0", "127.0.0.1:0", "c", "k", "ca"
		}, "gossip with a TLS control plane needs a gossip key: set gossip-key-file"},
		{"gossip key and insecure gossip", func(c *Config) {
			c.Gossip, c.Listen, c.Insecure, c.GossipKeyFile, c.GossipInsecure = "127.0.0.1:0", "127.0.0.1:0", true, "k", true
		}, "gossip-key-file and gossip-insecure are both set"},
		{"gossip key without gossip", func(c *Config) { c.GossipKeyFile = "k" }, "need gossip"},
		{"push-pull without gossip", func(c *Config) { c.GossipPushPull = time.Second }, "need gossip"},
		{"negative push-pull period", func(c *Config) {
			c.Gossip, c.Listen, c.Insecure, c.GossipPushPull = "127.0.0.1:0", "127.0.0.1:0", true, -time.Second
		}, "gossip-push-pull -1s: use a positive duration"},
		{"cluster name without gossip", func(c *Config) { c.GossipCluster = "farm-1" }, "need gossip"},
		{"long cluster name", func(c *Config) {
			c.Gossip, c.Listen, c.Insecure, c.GossipCluster = "127.0.0.1:0", "127.0.0.1:0", true, strings.Repeat("f", 256)
		}, "gossip-cluster is 256 bytes"},
		{"zone", func(c *Config) { c.Zone = "Rack 3" }, "set --zone"},
		{"default redundancy", func(c *Config) { c.DefaultRedundancy = "mirror" }, "default-redundancy: invalid argument: redundancy \"mirror\""},
		{"negative move rate", func(c *Config) { c.MoveRate = -1 }, "move-rate -1B is below 16MiB"},
		{"move rate below an evacuation's least", func(c *Config) { c.MoveRate = size.MiB }, "move-rate 1MiB is below 16MiB"},
		{"no evacuation moves", func(c *Config) { c.EvacuateMoves = 0 }, "evacuate-moves 0 is out of range; use 1 to 64"},
		{"too many evacuation moves", func(c *Config) { c.EvacuateMoves = 65 }, "evacuate-moves 65 is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate()
			require.ErrorIs(t, err, ErrConfig)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestUnusableDirs(t *testing.T) {
	cfg := testConfig(t)
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	cfg.DataDir = filepath.Join(f, "sub")
	_, err := New(cfg, nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "sub")

	cfg = testConfig(t)
	cfg.Socket = filepath.Join(f, "p.sock")
	_, err = New(cfg, nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "--socket")

	// A second daemon on the same socket is refused; the first keeps serving.
	cfg = testConfig(t)
	d, err := Start(cfg, nil)
	require.NoError(t, err)
	defer d.Close()
	cfg2 := cfg
	cfg2.DataDir = t.TempDir()
	_, err = New(cfg2, nil)
	require.ErrorContains(t, err, "another poold")
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("emulate-cxl: 2GiB\nlease-ttl: 3s\n"))
	f.Add([]byte("join: [10.0.0.1:7946, 10.0.0.2:7946]\ngossip: 10.0.0.3:7946\nlisten: 10.0.0.3:7950\n"))
	f.Add([]byte("node: [\n"))
	f.Add([]byte("unknown: 1\n"))
	f.Add([]byte("node: a\nnode: b\nlease-ttl: 10\n"))
	f.Add([]byte("- a\n- b\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		base := DefaultConfig()
		c, err := ParseConfig(b, base)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not match ErrConfig", err)
			}
			if !reflect.DeepEqual(c, base) {
				t.Fatal("a failed parse changed the configuration")
			}
			return
		}
		_ = c.Validate()
	})
}

func TestOrphanedFilesSwept(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	r, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	// A crash between Create and the commit: a file no record names.
	d := p.device(r.Device)
	b, err := d.Create(999, 8192, d.Align())
	require.NoError(t, err)
	b.File.Close()
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	ids, err := p.device(r.Device).Device.(interface{ Segments() ([]uint64, error) }).Segments()
	require.NoError(t, err)
	require.Equal(t, []uint64{r.ID}, ids, "the orphan is gone, the committed segment stays")
}

// An allocation whose caller gave up before the answer is freed: nobody
// would ever learn its id, and its owner's live session would keep it.
func TestAllocCallerGaveUp(t *testing.T) {
	cfg := testConfig(t)
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = d.alloc(ctx, admin(), &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, d.pool.List(), "the abandoned segment is still allocated")
	seg, err := d.alloc(context.Background(), admin(), &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	require.Len(t, d.pool.List(), 1)
	require.NoError(t, d.pool.Free(admin(), seg.Id, ""))
}
