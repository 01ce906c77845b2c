package pool

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/paths"
	redspec "github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma/tcp"
)

// Config is poold's configuration. Every field has a YAML key (the same name
// as its flag) so that one file can set what the flags set. A plain value:
// the daemon keeps its own copy, so changing one after New has no effect.
type Config struct {
	// Node is this daemon's name in listings and the cluster. Default: the host name.
	Node string `yaml:"node"`
	// DataDir holds the metadata store and the emulated device's files.
	// Default: /var/lib/farmem as root, else $XDG_STATE_HOME/farmem (~/.local/state/farmem).
	DataDir string `yaml:"data-dir"`
	// Socket is the unix socket of the control plane and descriptor passing.
	// Default: $FARMEM_SOCKET, else /run/farmem/poold.sock as root, else $XDG_RUNTIME_DIR/farmem/poold.sock.
	Socket string `yaml:"socket"`
	// SysfsRoot is where discovery reads the kernel's view. Default: /sys.
	SysfsRoot string `yaml:"sysfs-root"`
	// DevRoot is prefixed to device paths such as /dev/dax0.0, for a
	// container that mounts the host's /dev elsewhere, and for tests. Default: "/".
	DevRoot string `yaml:"dev-root"`
	// EmulateCXL is the size of the emulated CXL device used when discovery
	// finds no CXL memory. Default: 1GiB. Zero disables the emulated device.
	EmulateCXL size.Size `yaml:"emulate-cxl"`
	// ForceEmulate adds the emulated device even when real CXL memory exists. Default: false.
	ForceEmulate bool `yaml:"force-emulate"`
	// EmulateDir holds the emulated device's segment files; a hugetlbfs mount
	// makes it a hugetlb-backed device. Default: a directory in /dev/shm
	// named after the user and DataDir (so two daemons never share it), or
	// DataDir/emulated-cxl where /dev/shm is missing. Shared memory keeps
	// the contents across daemon restarts without writing them to disk; a
	// reboot loses them, and the daemon then reports those segments lost.
	EmulateDir string `yaml:"emulate-dir"`
	// ShmDir is the shared-memory directory under which the daemon keeps
	// segment files (emulated-cxl/, numa/, export/) unless EmulateDir or
	// NUMADir say otherwise. Default: /dev/shm/farmem-<uid>-<hash of the
	// data directory>, so two daemons on a host never share it; the data
	// directory where /dev/shm is missing.
	ShmDir string `yaml:"shm-dir"`
	// NUMADir is the tmpfs directory for segments on memory-only NUMA nodes.
	// Default: beside the default EmulateDir.
	NUMADir string `yaml:"numa-dir"`
	// LocalSize is the capacity of the local DRAM reference tier. Default: 1GiB. Zero disables it.
	LocalSize size.Size `yaml:"local-size"`
	// ExportSize is how much memory this host lends as the rdma tier: to
	// peers, and to its own clients over loopback when it has no peers.
	// Default: 1GiB. Zero disables the rdma tier's serving side.
	ExportSize size.Size `yaml:"export-size"`
	// DataListen is the data plane's TCP address (one-sided operations on
	// rdma-tier segments). Default: 127.0.0.1:0 (loopback, any free port);
	// give a reachable address to serve peers.
	DataListen string `yaml:"data-listen"`
	// Listen is the TCP address of the gRPC control plane for peers and
	// remote memctl. Default: "" (unix socket only). Required with Gossip.
	Listen string `yaml:"listen"`
	// Gossip is the memberlist address (ip:port) this daemon gossips on to
	// find peers and lend them memory. Default: "" (no cluster). The
	// memberlist default port is 7946.
	Gossip string `yaml:"gossip"`
	// Zone is this node's failure domain (a rack, a power feed, a cloud
	// zone), gossiped to peers: the copies of a redundant segment go to
	// distinct zones while there are enough. 1 to 63 bytes of [a-z0-9._-].
	// Default: "" (no zone: every node its own domain).
	Zone string `yaml:"zone"`
	// DefaultRedundancy is the redundancy of an Alloc on the rdma tier
	// that names none (internal/redundancy's text form: none,
	// replicas=N, ec=K+M, optionally ",or-fewer"). Default: "none".
	DefaultRedundancy string `yaml:"default-redundancy"`
	// Join lists peers' gossip addresses (host:port) to join at start.
	// When none of them answers (or there are none but this node), a
	// restarted node contacts a few of the members its metadata store
	// remembers seeing alive, so a cluster's first node, or one whose
	// seeds are gone, finds the cluster again.
	Join []string `yaml:"join"`
	// GossipProfile tunes failure detection: lan (default), local (fast,
	// for one machine and tests) or wan.
	GossipProfile string `yaml:"gossip-profile"`
	// GossipPushPull is how often this node syncs its whole membership
	// state with one random peer, which repairs what a broadcast missed (a
	// drain, a capacity change, a join): a node that missed one learns it
	// within this long. Default 0: the profile's (lan 30s, local 15s, wan
	// 60s).
	GossipPushPull time.Duration `yaml:"gossip-push-pull"`
	// GossipCluster names the cluster on the wire (memberlist's label):
	// every gossip packet and stream carries it, and a node takes only
	// those of its own cluster, so that two clusters never merge through
	// an address one's node contacts that the other's holds (a stale
	// seed, the address of a member that died, handed to another
	// cluster's host). Every node of a cluster needs the same one: a node
	// with another, or none, is not admitted, so it is added or changed on
	// every node at once (restarted together). At most 255 bytes.
	// Default: "" (none).
	GossipCluster string `yaml:"gossip-cluster"`
	// GossipKeyFile names the gossip key file: base64 keys of 16, 24 or 32
	// bytes, one a line, the first the primary ('memctl certs init' writes
	// gossip.key). Every gossip packet is then sealed with AES-GCM and a
	// node without the key is not admitted. Keys changed with 'memctl
	// keyring' are kept in DataDir/gossip.keyring, which wins over this
	// file at the next start (keys only in this file are added). Required
	// with Gossip when the control plane has TLS, unless GossipInsecure.
	// Default: "".
	GossipKeyFile string `yaml:"gossip-key-file"`
	// GossipInsecure gossips in plaintext although the control plane has
	// TLS: anyone who reaches the gossip port can join and announce
	// capacity. It logs a warning at start and memctl status shows it.
	// Default: false.
	GossipInsecure bool `yaml:"gossip-insecure"`
	// LeaseTTL is how long a client's unnamed segments outlive its last session. Default: 10s.
	LeaseTTL time.Duration `yaml:"lease-ttl"`
	// PeerLeaseTTL is how long the segments another poold placed here
	// (for its clients, or as a copy or shard of a redundant segment)
	// outlive that daemon's last session here. It is longer than LeaseTTL
	// because a peer's session also ends when the network between the two
	// hosts is cut, and the memory here may then hold the only copy of a
	// segment the peer will serve again once the partition heals; a peer
	// that restarts with its data directory asks for what it no longer
	// records and frees it at once. A value below
	// LeaseTTL counts as LeaseTTL. Default: 5m.
	PeerLeaseTTL time.Duration `yaml:"peer-lease-ttl"`
	// AllowDevdaxFD lets the daemon hand a whole devdax device's descriptor to
	// clients. One descriptor reaches every segment on the device, so this
	// trusts every local client with all of them. Default: false, and devdax
	// segments cannot be mapped by clients until it is set.
	AllowDevdaxFD bool `yaml:"allow-devdax-fd"`
	// MetadataFsync makes every commit (allocation, free, name, attach) of
	// a segment whose contents survive a power loss — on persistent memory,
	// or on a peer — wait for fsync before the reply, so its record
	// survives a power loss or kernel crash as well as a crash of poold.
	// Concurrent commits share one fsync. Records of segments in volatile
	// memory are never fsynced: they survive a crash of poold, and go with
	// their contents when the host restarts (see store). Default: true.
	// Turning it off is unsafe: commits then only reach the kernel before
	// the reply, which survives kill -9 of poold but not a host crash,
	// after which an acknowledged allocation or free can be missing from
	// the table.
	MetadataFsync bool `yaml:"metadata-fsync"`
	// Hotplug makes the daemon follow the kernel's device events (uevents
	// of the dax, cxl, memory and node subsystems) and read the host's
	// memory devices again when they change: a CXL region or DAX device
	// that appears becomes a device of its tier, one that goes away stops
	// taking placements and its segments are lost. Default: true.
	Hotplug bool `yaml:"hotplug"`
	// MeasureTiers makes the daemon measure each tier it offers (load
	// latency, bandwidth; one-sided reads for the rdma tier) in the
	// background at start, briefly taking up to 64 MiB of each tier, and
	// in a cluster each peer's data plane (one-sided reads of a 2 MiB
	// probe segment there) when the peer joins, comes back or announces
	// another data-plane address. Default: true.
	MeasureTiers bool `yaml:"measure-tiers"`
	// MeasurePeersEvery is how often, in a cluster with MeasureTiers, the
	// daemon measures every peer's data plane again; each period is drawn
	// within ±20% of it. 0: only on the changes above. Default: 3m.
	MeasurePeersEvery time.Duration `yaml:"measure-peers-every"`
	// EmulateLatency injects latency into the calls clients make on a
	// tier's segments (ReadAt, WriteAt, atomics) so a host without the
	// hardware behaves like one with it, e.g. "cxl=200ns,rdma=2us/12GB/s":
	// per tier a latency and an optional bandwidth cap (a call of n bytes
	// takes latency + n/bandwidth). Clients apply it; one can override it
	// for itself (alloc.WithEmulateLatency). Direct access through
	// Segment.Bytes cannot be slowed. Shown everywhere as "injected".
	// Default: "" (none).
	EmulateLatency emulation.Spec `yaml:"emulate-latency"`
	// TLSCert is this node's certificate (PEM): the TCP control plane
	// presents it to clients, and this daemon presents it to its peers.
	// 'memctl certs init' makes one per node. Required with Listen unless
	// Insecure. Default: "".
	TLSCert string `yaml:"tls-cert"`
	// TLSKey is TLSCert's private key (PEM). Default: "".
	TLSKey string `yaml:"tls-key"`
	// TLSCA is the CA certificate (PEM) that clients' and peers'
	// certificates must chain to (mutual TLS), and that peers' server
	// certificates are checked against. Default: "".
	TLSCA string `yaml:"tls-ca"`
	// Insecure serves the TCP control plane, and calls peers, in plaintext:
	// anyone who reaches Listen can allocate and free. It logs a warning at
	// start and memctl status shows it. Default: false.
	Insecure bool `yaml:"insecure"`
	// DataInsecure serves the data plane (rdma tier over TCP) in plaintext
	// although the control plane has TLS: credentials, keys and data
	// cross the network readable, and a captured handshake can be
	// replayed. It logs a warning at start and memctl status shows it.
	// Without control-plane TLS the data plane is plaintext anyway.
	// Default: false (TLS 1.3 with the node certificate).
	DataInsecure bool `yaml:"data-insecure"`
	// AllowUIDs are the uids of local processes that may use the unix
	// socket (checked with SO_PEERCRED). Their segments belong to the
	// identity uid:N. Default: root (0) and the daemon's own uid.
	AllowUIDs IDList `yaml:"allow-uids"`
	// AllowGIDs are gids whose processes may use the unix socket too.
	// Default: none.
	AllowGIDs IDList `yaml:"allow-gids"`
	// Admins are the identities whose calls without a session are an
	// administrator's: they see every segment and may free any, attach
	// any name, allocate named and persistent segments for nobody's
	// session, and drain nodes (memctl does all of this without a
	// session). A call without a session from anyone else is refused.
	// Entries: uid:N and gid:N (primary gid) on the unix socket, cn:NAME
	// for a client certificate over TLS. With Insecure every plaintext
	// TCP caller is one, since nothing is proved there. Default: uid:0
	// and the daemon's own uid.
	Admins Identities `yaml:"admins"`
	// Quotas limits the bytes each identity may hold per tier (see
	// Quotas); an allocation past one fails with ErrNoCapacity naming the
	// quota. Identities: uid:N (unix socket), cn:NAME (TLS certificate),
	// insecure (plaintext TCP), default (everyone without an entry).
	// Default: none (unlimited).
	Quotas Quotas `yaml:"quotas"`
	// MaxSegmentsPerClient is the most segments one client id may hold on
	// this daemon; the next Alloc fails with ErrLimit. Unit: segments.
	// Default: 65536. Zero: unlimited.
	MaxSegmentsPerClient int `yaml:"max-segments-per-client"`
	// MaxNameLen is the longest segment name accepted, in bytes; a longer
	// one fails with ErrLimit. Default: 255 (also the most it can be).
	MaxNameLen int `yaml:"max-name-len"`
	// DataMaxInflight is the most operations one data-plane connection has
	// in flight at the server (answered but not yet flushed); the server
	// reads the connection's next request only below it, so a client that
	// pipelines more is held back by TCP flow control, never buffered
	// without bound. Unit: operations. Default: 64. Range: 1 to 4096.
	DataMaxInflight int `yaml:"data-max-inflight"`
	// DataBusyPoll is how long a data-plane connection whose client sends
	// one request at a time busy-polls its socket for the next request
	// before it sleeps: it saves the wake-up (two context switches) per
	// request, for the CPU time it spends polling; it backs off when
	// requests do not come within it or the cores are busy. Default:
	// 50µs. Zero: off. Range: 0 to 1ms.
	DataBusyPoll time.Duration `yaml:"data-busy-poll"`
	// DataMaxConns is the most data-plane connections open at once,
	// counting those still in their handshake; one over it is refused at
	// accept ("busy"). Unit: connections. Default: 4096.
	DataMaxConns int `yaml:"data-max-conns"`
	// DataMaxHandshakes is the most data-plane connections in their
	// handshake (hello not yet answered) at once, from all sources; one
	// over it is refused at accept, before anything is allocated for it.
	// Unit: connections. Default: 1024. Range: 1 to data-max-conns.
	DataMaxHandshakes int `yaml:"data-max-handshakes"`
	// DataMaxHandshakesPerSource is the most data-plane connections in
	// their handshake at once from one source address (an IPv4 address or
	// an IPv6 /64), so a flood from one host cannot lock out the others.
	// Clients behind one NAT share it, but each holds a slot only for the
	// round trip of its hello. Unit: connections. Default: 64. Range: 1 to
	// data-max-handshakes.
	DataMaxHandshakesPerSource int `yaml:"data-max-handshakes-per-source"`
	// DataMaxConnsPerTenant is the most authenticated data-plane
	// connections of one tenant at once (an identity's client ids
	// together, a peer daemon alone) once half of data-max-conns are open,
	// so that a client with a valid credential cannot hold every
	// connection the data plane takes. Unit:
	// connections. Default (0): a quarter of data-max-conns. Range: 0 to
	// data-max-conns.
	DataMaxConnsPerTenant int `yaml:"data-max-conns-per-tenant"`
	// DataFrameTimeout bounds how long an authenticated data-plane
	// connection takes to deliver one request (header and payload) once
	// its first byte arrived; a client stalled mid-request is disconnected.
	// Idle time between requests is not limited. Default: 10s. Range:
	// 100ms to 10m.
	DataFrameTimeout time.Duration `yaml:"data-frame-timeout"`
	// Rebuild: this daemon rebuilds the lost copies and shards of its
	// redundant segments on other hosts (false: they stay degraded until
	// set again, e.g. during maintenance). Default: true.
	Rebuild bool `yaml:"rebuild"`
	// RebuildRate bounds the bytes a second this daemon writes to new
	// homes while it rebuilds the lost copies and shards of its redundant
	// segments, all rebuilds together, so that they leave the network to
	// the applications. Unit: bytes a second. Default: 1GiB. Zero:
	// unlimited.
	RebuildRate size.Size `yaml:"rebuild-rate"`
	// MoveRate bounds the bytes a second that the live moves this daemon
	// directs copy, all together: its segments' moves to another node
	// (memctl move, a home's evacuation or rebalancing asking it to move
	// them away) and promotions to its cxl or local tier, so that an
	// evacuation leaves the network and the processors to the
	// applications. Each daemon paces the moves of the segments it
	// placed: a node that evacuates is emptied at up to MoveRate from
	// each of them. The moves of redundant segments' homes are paced by
	// RebuildRate, with the rebuilds; a demotion, whose segment is out of
	// use for its whole copy, and the last round of any copy, which
	// writes wait for, are not paced. Unit: bytes a second. Default: 0
	// (unlimited).
	MoveRate size.Size `yaml:"move-rate"`
	// EvacuateMoves is how many of its segments an evacuating node has
	// moved at once: more empty it sooner and leave the applications less
	// of the processors and the network meanwhile. Range: 1 to 64.
	// Default: 4.
	EvacuateMoves int `yaml:"evacuate-moves"`
	// Rebalance: while this node's rdma tier is used more than the
	// cluster's mean (of the alive nodes lending it and not draining) by
	// more than RebalanceThreshold, it moves segments peers placed here
	// to other nodes, one at a time, until it is within half the
	// threshold of the mean (rebalance.go). Default: false.
	Rebalance bool `yaml:"rebalance"`
	// RebalanceThreshold is how far above the cluster's mean used
	// fraction a node's rdma tier may be before Rebalance moves segments
	// away. Unit: a fraction (0.10: ten percentage points). Default: 0.10.
	// Range: above 0, below 1.
	RebalanceThreshold float64 `yaml:"rebalance-threshold"`
	// LogLevel is debug, info, warn or error. Default: info.
	LogLevel string `yaml:"log-level"`
	// LogFormat is text or json. Default: text.
	LogFormat string `yaml:"log-format"`
	// Metrics is the HTTP address (host:port) serving Prometheus metrics on
	// /metrics and health on /healthz and /readyz, e.g. 127.0.0.1:9464.
	// Default: "" (none).
	Metrics string `yaml:"metrics"`

	// sim holds hooks that only this package's tests set, to run hundreds
	// of daemons in one process (see simhooks.go); the zero value is poold's.
	sim simHooks
}

// leastMoveRate is the least Config.MoveRate other than unlimited: an
// evacuating node gives each move a second per leastMoveRate of its size
// times the moves it runs at once (moveWithin), which a paced origin
// given all of them meets.
const leastMoveRate = 16 << 20

// DefaultRebuildRate is Config.RebuildRate's default, in bytes a second:
// a 1 GiB copy is rebuilt in about a second, above half of what one
// TCP data-plane stream carries on a 10 Gb/s network.
const DefaultRebuildRate = size.GiB

// ErrConfig marks a configuration that cannot be used.
var ErrConfig = errors.New("bad configuration")

// DefaultConfig returns the configuration poold runs with when nothing is set.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	c := Config{
		Node:                 host,
		SysfsRoot:            "/sys",
		DevRoot:              "/",
		EmulateCXL:           size.GiB,
		LocalSize:            size.GiB,
		ExportSize:           size.GiB,
		DataListen:           "127.0.0.1:0",
		LeaseTTL:             10 * time.Second,
		PeerLeaseTTL:         5 * time.Minute,
		MetadataFsync:        true,
		LogLevel:             "info",
		MeasureTiers:         true,
		Hotplug:              true,
		MeasurePeersEvery:    3 * time.Minute,
		LogFormat:            "text",
		AllowUIDs:            defaultAllowUIDs(),
		Admins:               defaultAdmins(),
		MaxSegmentsPerClient: 65536,
		MaxNameLen:           MaxNameLen,
		DataMaxInflight:      64,
		DataBusyPoll:         tcp.DefaultBusyPoll,
		Rebuild:              true,
		RebuildRate:          DefaultRebuildRate,
		EvacuateMoves:        evacMoves,
		RebalanceThreshold:   DefaultRebalanceThreshold,
		DataDir:              DefaultDataDir(),
		Socket:               DefaultSocket(),
	}
	// The data plane's admission limits are its server's defaults.
	dp := tcp.DefaultConfig()
	c.DataMaxConns, c.DataMaxHandshakes = dp.MaxConns, dp.MaxHandshakes
	c.DataMaxHandshakesPerSource, c.DataFrameTimeout = dp.MaxHandshakesPerSource, dp.FrameTimeout
	return c
}

// DefaultDataDir is where the daemon keeps its state when not told otherwise.
func DefaultDataDir() string { return paths.DataDir() }

// DefaultSocket is the socket path clients and the daemon agree on when not
// told otherwise; see package paths.
func DefaultSocket() string { return paths.Socket() }

// Validate reports the first setting that cannot work, naming it.
func (c *Config) Validate() error {
	switch {
	case c.Node == "":
		return fmt.Errorf("%w: node is empty; set --node", ErrConfig)
	case c.DataDir == "":
		return fmt.Errorf("%w: data-dir is empty; set --data-dir", ErrConfig)
	case c.Socket == "":
		return fmt.Errorf("%w: socket is empty; set --socket", ErrConfig)
	case len(c.Socket) > 107:
		return fmt.Errorf("%w: socket path %q is %d bytes, longer than a unix socket allows (107); choose a shorter --socket", ErrConfig, c.Socket, len(c.Socket))
	case c.EmulateCXL < 0:
		return fmt.Errorf("%w: emulate-cxl %d is negative", ErrConfig, c.EmulateCXL)
	case c.ExportSize < 0:
		return fmt.Errorf("%w: export-size %d is negative", ErrConfig, c.ExportSize)
	case c.LocalSize < 0:
		return fmt.Errorf("%w: local-size %d is negative", ErrConfig, c.LocalSize)
	case c.LeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: lease-ttl %s is below the 100ms minimum", ErrConfig, c.LeaseTTL)
	case c.PeerLeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: peer-lease-ttl %s is below the 100ms minimum", ErrConfig, c.PeerLeaseTTL)
	case c.RebuildRate < 0:
		return fmt.Errorf("%w: rebuild-rate %d is negative; use bytes a second, e.g. 512MiB, or 0 for unlimited", ErrConfig, c.RebuildRate)
	case c.MoveRate < 0 || c.MoveRate > 0 && c.MoveRate < leastMoveRate:
		return fmt.Errorf("%w: move-rate %s is below %s; use bytes a second, e.g. 256MiB, or 0 for unlimited (an evacuating node gives a move a second per %s of its size for each move it runs at once, which may all be this node's)",
			ErrConfig, c.MoveRate, size.Size(leastMoveRate), size.Size(leastMoveRate))
	case c.EvacuateMoves < 1 || c.EvacuateMoves > maxEvacMoves:
		return fmt.Errorf("%w: evacuate-moves %d is out of range; use 1 to %d (default %d)", ErrConfig, c.EvacuateMoves, maxEvacMoves, evacMoves)
	case !(c.RebalanceThreshold > 0 && c.RebalanceThreshold < 1):
		return fmt.Errorf("%w: rebalance-threshold %g is out of range; use a fraction above 0 and below 1, e.g. 0.1 for ten percentage points above the cluster's mean", ErrConfig, c.RebalanceThreshold)
	case c.MeasurePeersEvery < 0 || c.MeasurePeersEvery > 0 && c.MeasurePeersEvery < time.Second:
		return fmt.Errorf("%w: measure-peers-every %s: use 0 (only when peers change) or 1s and more (each probe reads a few MiB from every peer)", ErrConfig, c.MeasurePeersEvery)
	}
	if c.Zone != "" {
		if err := cluster.ValidZone(c.Zone); err != nil {
			return fmt.Errorf("%w: %w; set --zone to a name such as rack-3", ErrConfig, err)
		}
	}
	if _, err := redspec.Parse(c.DefaultRedundancy); err != nil {
		return fmt.Errorf("%w: default-redundancy: %w", ErrConfig, err)
	}
	if err := c.validateSecurity(); err != nil {
		return err
	}
	if c.Gossip != "" && c.Listen == "" {
		return fmt.Errorf("%w: gossip needs listen: peers reach this daemon's control plane at --listen ADDR", ErrConfig)
	}
	if (len(c.Join) > 0 || c.GossipProfile != "" || c.GossipPushPull != 0 || c.GossipCluster != "" || c.GossipKeyFile != "" || c.GossipInsecure) && c.Gossip == "" {
		return fmt.Errorf("%w: join, gossip-profile, gossip-push-pull, gossip-cluster, gossip-key-file and gossip-insecure need gossip: set --gossip ADDR", ErrConfig)
	}
	if len(c.GossipCluster) > cluster.MaxLabel {
		return fmt.Errorf("%w: gossip-cluster is %d bytes; name the cluster in at most %d", ErrConfig, len(c.GossipCluster), cluster.MaxLabel)
	}
	if c.GossipPushPull < 0 {
		return fmt.Errorf("%w: gossip-push-pull %s: use a positive duration such as 10s, or 0 for the gossip profile's", ErrConfig, c.GossipPushPull)
	}
	switch {
	case c.GossipKeyFile != "" && c.GossipInsecure:
		return fmt.Errorf("%w: gossip-key-file and gossip-insecure are both set; choose one", ErrConfig)
	case c.Gossip != "" && c.GossipKeyFile == "" && !c.GossipInsecure && !c.Insecure:
		return fmt.Errorf("%w: gossip with a TLS control plane needs a gossip key: set gossip-key-file (make one with 'memctl certs init --dir DIR --nodes %s', which writes DIR/gossip.key, or 'head -c 32 /dev/urandom | base64 > gossip.key'), or set gossip-insecure to gossip in plaintext", ErrConfig, c.Node)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("%w: log-level %q: use debug, info, warn or error", ErrConfig, c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("%w: log-format %q: use text or json", ErrConfig, c.LogFormat)
	}
	return nil
}

func (c *Config) emulateDir() string {
	if c.EmulateDir != "" {
		return c.EmulateDir
	}
	return filepath.Join(c.shmDir(), "emulated-cxl")
}

func (c *Config) numaDir() string {
	if c.NUMADir != "" {
		return c.NUMADir
	}
	return filepath.Join(c.shmDir(), "numa")
}

// shmDir is this daemon's directory in shared memory: one per user and
// data directory, so that two daemons on a host never share files.
func (c *Config) shmDir() string {
	if c.ShmDir != "" {
		return c.ShmDir
	}
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		return c.DataDir
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		abs = c.DataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return fmt.Sprintf("/dev/shm/farmem-%d-%x", os.Getuid(), sum[:4])
}

// LoadConfig reads a YAML file over base: keys in the file replace base's
// values, keys not in the file keep them. An unknown key is an error that
// names it.
func LoadConfig(path string, base Config) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return base, fmt.Errorf("%w: read config: %w", ErrConfig, err)
	}
	return ParseConfig(b, base)
}

// ParseConfig is LoadConfig on bytes. An error names the line and key and
// says what to write; base comes back unchanged with it.
func ParseConfig(b []byte, base Config) (Config, error) {
	c := base
	if err := decodeConfig(b, &c); err != nil {
		return base, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, nil
}
