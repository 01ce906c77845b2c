package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/farmem/farmem/pool"
)

func main() {
	if err := newCommand(os.Args[1:]).Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "poold: %v\n", err)
		os.Exit(1)
	}
}

// configArg finds --config in args before flags are parsed, so that the
// file's values become the flags' defaults and flags given override them.
func configArg(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			return v
		}
		if a == "--config" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func newCommand(args []string) *cobra.Command {
	cfg := pool.DefaultConfig()
	var cfgErr error
	if path := configArg(args); path != "" {
		cfg, cfgErr = pool.LoadConfig(path, cfg)
	}
	var configFile string
	var retire bool
	cmd := &cobra.Command{
		Use:   "poold",
		Short: "farmem's far-memory pool daemon",
		Long: `poold owns this host's far memory and lends it to applications through the
alloc library and memctl. It discovers CXL memory from sysfs (devdax devices,
memory-only NUMA nodes); on a host without CXL it serves an emulated CXL device
(ordinary memory in files, always labelled emulated) and a local DRAM tier.

Every flag can also be set in a YAML file given with --config, under the
flag's name as key (e.g. "emulate-cxl: 2GiB"); flags override the file.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgErr != nil {
				return cfgErr
			}
			if retire {
				return runRetire(cfg, cmd.OutOrStdout())
			}
			return run(cfg)
		},
	}
	cmd.SetArgs(args)
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML file with any of these settings (keys are the flag names)")
	f.BoolVar(&retire, "retire", false, "remove this stopped pool for good, then exit: its segment files in shared memory and its segment table (the data directory's other files stay); refused while a poold uses them")
	f.StringVar(&cfg.Node, "node", cfg.Node, "this daemon's name")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the metadata store and the emulated device's files")
	f.StringVar(&cfg.Socket, "socket", cfg.Socket, "unix socket for local clients (FARMEM_SOCKET sets the default)")
	f.StringVar(&cfg.SysfsRoot, "sysfs-root", cfg.SysfsRoot, "where to read the kernel's view of CXL, DAX and NUMA memory")
	f.StringVar(&cfg.DevRoot, "dev-root", cfg.DevRoot, "prefix for device paths such as /dev/dax0.0 (containers)")
	f.Var(&cfg.EmulateCXL, "emulate-cxl", "size of the emulated CXL device used when no CXL memory is found (0 disables)")
	f.BoolVar(&cfg.ForceEmulate, "force-emulate", cfg.ForceEmulate, "add the emulated device even when CXL memory exists")
	f.StringVar(&cfg.EmulateDir, "emulate-dir", cfg.EmulateDir, "directory for the emulated device's files; a hugetlbfs mount makes it hugetlb-backed (default: a per-daemon directory in /dev/shm)")
	f.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "shared-memory directory for segment files (default: /dev/shm/farmem-UID-HASH)")
	f.Var(&cfg.ExportSize, "export-size", "memory this host lends as the rdma tier (0 disables)")
	f.StringVar(&cfg.DataListen, "data-listen", cfg.DataListen, "data plane TCP address for one-sided operations")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "TCP address of the gRPC control plane for peers and memctl (needed with --gossip)")
	f.StringVar(&cfg.Gossip, "gossip", cfg.Gossip, "gossip (memberlist) address ip:port to find peers, e.g. 10.0.0.5:7946 (default: no cluster)")
	f.StringVar(&cfg.Zone, "zone", cfg.Zone, "this node's failure domain (rack, power feed, cloud zone), gossiped: copies of a redundant segment go to distinct zones (default: none)")
	f.StringVar(&cfg.DefaultRedundancy, "default-redundancy", cfg.DefaultRedundancy, "redundancy of rdma-tier allocations that ask for none: none, replicas=N or ec=K+M, optionally ,or-fewer (default: none)")
	f.StringSliceVar(&cfg.Join, "join", cfg.Join, "peers' gossip addresses to join, host:port[,...]; when none answers, a restart contacts members the data directory remembers")
	f.StringVar(&cfg.GossipProfile, "gossip-profile", cfg.GossipProfile, "failure-detection timing: lan (default), local or wan")
	f.DurationVar(&cfg.GossipPushPull, "gossip-push-pull", cfg.GossipPushPull, "sync the whole membership state with one random peer this often, which repairs what a broadcast missed (0: the gossip profile's, lan 30s, local 15s, wan 60s)")
	f.StringVar(&cfg.GossipCluster, "gossip-cluster", cfg.GossipCluster, "the cluster's name on the wire: gossip packets and streams carry it and only nodes with the same name are admitted, so that two clusters never merge through a reused address; every node of a cluster needs the same: add or change it on all nodes at once (default: none)")
	f.StringVar(&cfg.GossipKeyFile, "gossip-key-file", cfg.GossipKeyFile, "gossip keys, base64 of 16, 24 or 32 bytes, one a line, the first the primary: gossip sealed with AES-GCM, nodes without the key not admitted ('memctl certs init' writes gossip.key); required with --gossip and TLS")
	f.BoolVar(&cfg.GossipInsecure, "gossip-insecure", cfg.GossipInsecure, "gossip in plaintext although the control plane has TLS (anyone who reaches the gossip port can join); logs a warning, shown by memctl status")
	f.StringVar(&cfg.NUMADir, "numa-dir", cfg.NUMADir, "tmpfs directory for segments on memory-only NUMA nodes (default: a per-daemon directory in /dev/shm)")
	f.Var(&cfg.LocalSize, "local-size", "capacity of the local DRAM tier (0 disables)")
	f.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "how long a client's unnamed segments outlive its last session")
	f.DurationVar(&cfg.PeerLeaseTTL, "peer-lease-ttl", cfg.PeerLeaseTTL, "how long the segments another poold placed here outlive its last session here (a partition shorter than this loses none of them); never shorter than --lease-ttl")
	f.BoolVar(&cfg.AllowDevdaxFD, "allow-devdax-fd", cfg.AllowDevdaxFD, "hand whole devdax devices to clients (one descriptor reaches every segment on the device)")
	f.BoolVar(&cfg.MetadataFsync, "metadata-fsync", cfg.MetadataFsync, "fsync every metadata commit of a segment on persistent memory or a peer before the reply (default; volatile memory's records are never fsynced); --metadata-fsync=false is unsafe: a host crash can then lose acknowledged allocations and frees")
	f.BoolVar(&cfg.Hotplug, "hotplug", cfg.Hotplug, "follow the kernel's device events and pick up CXL regions and DAX devices that appear, or drop those that go, while running")
	f.BoolVar(&cfg.MeasureTiers, "measure-tiers", cfg.MeasureTiers, "measure each tier's latency and bandwidth in the background at start (briefly takes up to 64MiB of each tier), and each peer's data plane when it joins or moves")
	f.DurationVar(&cfg.MeasurePeersEvery, "measure-peers-every", cfg.MeasurePeersEvery, "measure every peer's data plane again this often, ±20% (0: only when a peer joins, comes back or moves)")
	f.Var(&cfg.EmulateLatency, "emulate-latency", `inject latency into clients' ReadAt, WriteAt and atomics per tier, e.g. "cxl=200ns,rdma=2us/12GB/s" (latency[/bandwidth]; shown as injected; Bytes() access is not slowed)`)
	f.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "this node's certificate (PEM) for mutual TLS on --listen and towards peers ('memctl certs init' makes one)")
	f.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "the private key of --tls-cert (PEM)")
	f.StringVar(&cfg.TLSCA, "tls-ca", cfg.TLSCA, "CA certificate (PEM) that clients' and peers' certificates must chain to")
	f.BoolVar(&cfg.Insecure, "insecure", cfg.Insecure, "serve --listen and call peers in plaintext (anyone who reaches it can allocate and free); logs a warning, shown by memctl status")
	f.BoolVar(&cfg.DataInsecure, "data-insecure", cfg.DataInsecure, "serve the data plane (rdma tier over TCP) in plaintext although --listen has TLS (credentials, keys and data readable on the wire); logs a warning, shown by memctl status")
	f.Var(&cfg.AllowUIDs, "allow-uid", "uids allowed on the unix socket, comma-separated (default: root and this daemon's uid)")
	f.Var(&cfg.AllowGIDs, "allow-gid", "gids allowed on the unix socket, comma-separated (default: none)")
	f.Var(&cfg.Admins, "admin", "identities whose calls without a session are an administrator's (memctl): uid:N, gid:N or cn:NAME, comma-separated, repeatable; each adds to the list (default: uid:0 and this daemon's uid)")
	f.Var(&cfg.Quotas, "quota", "bytes an identity may hold on a tier, IDENTITY/TIER=SIZE, repeatable, e.g. uid:1000/cxl=8GiB or default/rdma=4GiB")
	f.IntVar(&cfg.MaxSegmentsPerClient, "max-segments-per-client", cfg.MaxSegmentsPerClient, "most segments one client id may hold (0: unlimited)")
	f.IntVar(&cfg.MaxNameLen, "max-name-len", cfg.MaxNameLen, "longest segment name in bytes (1 to 255)")
	f.IntVar(&cfg.DataMaxInflight, "data-max-inflight", cfg.DataMaxInflight, "most operations in flight per data-plane connection (1 to 4096)")
	f.DurationVar(&cfg.DataBusyPoll, "data-busy-poll", cfg.DataBusyPoll, "how long a data-plane connection at one request in flight busy-polls for the next before sleeping (0: off; at most 1ms)")
	f.IntVar(&cfg.DataMaxConns, "data-max-conns", cfg.DataMaxConns, "most data-plane connections open at once, those in their handshake included; more are refused at accept")
	f.IntVar(&cfg.DataMaxHandshakes, "data-max-handshakes", cfg.DataMaxHandshakes, "most data-plane connections in their handshake at once, from all sources (1 to --data-max-conns)")
	f.IntVar(&cfg.DataMaxHandshakesPerSource, "data-max-handshakes-per-source", cfg.DataMaxHandshakesPerSource, "most data-plane connections in their handshake at once from one address (IPv4) or /64 (IPv6); clients behind one NAT share it (1 to --data-max-handshakes)")
	f.IntVar(&cfg.DataMaxConnsPerTenant, "data-max-conns-per-tenant", cfg.DataMaxConnsPerTenant, "most authenticated data-plane connections of one tenant (an identity's client ids together) once half of --data-max-conns are open (0: a quarter of --data-max-conns)")
	f.DurationVar(&cfg.DataFrameTimeout, "data-frame-timeout", cfg.DataFrameTimeout, "how long an authenticated data-plane client may take to send one request once it began; idle time between requests is not limited (100ms to 10m)")
	f.BoolVar(&cfg.Rebuild, "rebuild", cfg.Rebuild, "rebuild the lost copies and shards of this node's redundant segments on other hosts (--rebuild=false leaves them degraded)")
	f.Var(&cfg.RebuildRate, "rebuild-rate", "bytes a second that rebuilds of lost copies and shards of redundant segments may write, all together, e.g. 256MiB (0: unlimited)")
	f.IntVar(&cfg.EvacuateMoves, "evacuate-moves", cfg.EvacuateMoves, "how many segments this node has moved at once while it evacuates (1 to 64): more empty it sooner and leave its applications less meanwhile")
	f.Var(&cfg.MoveRate, "move-rate", "bytes a second that the live moves of the segments this node placed may copy, all together (to other nodes, evacuations included, and promotions to its cxl or local tier; rebuilds and redundant homes go at --rebuild-rate), e.g. 256MiB (0: unlimited)")
	f.BoolVar(&cfg.Rebalance, "rebalance", cfg.Rebalance, "move segments of peers away while this node's rdma tier is used above the cluster's mean by more than --rebalance-threshold")
	f.Float64Var(&cfg.RebalanceThreshold, "rebalance-threshold", cfg.RebalanceThreshold, "with --rebalance, how far above the cluster's mean used fraction this node may be, e.g. 0.1 for ten percentage points (above 0, below 1)")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	f.StringVar(&cfg.Metrics, "metrics", cfg.Metrics, "HTTP address for Prometheus /metrics and the /healthz, /readyz probes, e.g. 127.0.0.1:9464 (default: none)")
	return cmd
}

func newLogger(cfg pool.Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// runRetire removes a stopped pool (pool.Retire) and says what it removed
// and what it left.
func runRetire(cfg pool.Config, out io.Writer) error {
	removed, kept, err := pool.Retire(cfg)
	for _, p := range removed {
		fmt.Fprintf(out, "removed %s\n", p)
	}
	for _, p := range kept {
		fmt.Fprintf(out, "kept %s (given with --emulate-dir or --numa-dir, or holds other files: remove it yourself if it is no longer needed)\n", p)
	}
	if err == nil && len(removed) == 0 {
		fmt.Fprintf(out, "nothing to remove for --data-dir %s\n", cfg.DataDir)
	}
	return err
}

func run(cfg pool.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := newLogger(cfg)
	// Signals are caught from before New: its socket accepts while it still
	// opens the devices and the metadata store, and a SIGTERM meanwhile
	// must stop poold cleanly once they are open, not kill it halfway.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	d, err := pool.New(cfg, log)
	if err != nil {
		return err
	}
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
		return d.Close()
	default:
	}
	go func() {
		s := <-sig
		log.Info("shutting down", "signal", s.String())
		d.Close()
	}()
	if err := d.Serve(); err != nil {
		d.Close()
		return err
	}
	log.Info("stopped")
	return d.Close()
}
