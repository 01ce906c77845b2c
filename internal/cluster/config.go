package cluster

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/hashicorp/memberlist"
)

// Profiles name memberlist's stock timing configurations.
const (
	// ProfileLAN is memberlist.DefaultLANConfig: probe every 1 s, 500 ms probe
	// timeout, gossip every 200 ms, dead nodes remembered 30 s. The default.
	ProfileLAN = "lan"
	// ProfileLocal is memberlist.DefaultLocalConfig: faster failure detection
	// for loopback and tests (200 ms probe timeout, gossip every 100 ms, dead
	// nodes remembered 15 s).
	ProfileLocal = "local"
	// ProfileWAN is memberlist.DefaultWANConfig: probe every 5 s, 3 s probe
	// timeout, dead nodes remembered 60 s.
	ProfileWAN = "wan"
)

// DefaultPort is the gossip port (UDP and TCP) of poold.
const DefaultPort = 7946

// MaxLabel is the longest Config.Label, in bytes (memberlist's limit).
const MaxLabel = memberlist.LabelMaxSize

// Config configures one node's gossip. Get one from DefaultConfig, change
// what you need, and pass it to New, which calls Validate. A Config is a
// plain value, not synchronized: do not modify one while another goroutine
// reads it. New keeps its own copy (except Transport, which New takes over).
type Config struct {
	// Name is the node's name, unique in the cluster. Default: the host name.
	Name string
	// BindAddr is the IP address gossip listens on, UDP and TCP. Default
	// "0.0.0.0". Ignored when Transport is set.
	BindAddr string
	// BindPort is the gossip port, UDP and TCP. Default 7946; 0 picks a free
	// port (Self().Addr reports it). Ignored when Transport is set.
	BindPort int
	// AdvertiseAddr is the IP address peers use to reach this node. Default
	// "": the bound address, or a private address of the host when bound to
	// 0.0.0.0.
	AdvertiseAddr string
	// AdvertisePort is the port peers use to reach this node. Default 0: the
	// bound port.
	AdvertisePort int
	// Join lists seed addresses (host:port) that Join(ctx, nil) contacts.
	// Default none. New never contacts them.
	Join []string
	// Transport carries gossip instead of memberlist's UDP+TCP transport
	// (nil, the default). Tests and simulations pass a memnet.Transport. New
	// takes it over: it is shut down by Shutdown, or by New if New fails.
	Transport memberlist.NodeAwareTransport
	// Profile picks memberlist's timing defaults: ProfileLAN (default, also
	// for ""), ProfileLocal or ProfileWAN.
	Profile string

	// The fields below override the profile; zero keeps the profile's value.

	// ProbeInterval is how often each node probes one random peer (duration).
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for an ack before indirect
	// probes start (duration, less than ProbeInterval).
	ProbeTimeout time.Duration
	// GossipInterval is how often each node gossips to a few peers (duration).
	GossipInterval time.Duration
	// SuspicionMult scales how long a suspect node has to refute before it is
	// declared dead: SuspicionMult * log10(nodes) * ProbeInterval (count).
	SuspicionMult int
	// PushPullInterval is how often a full state sync with one random peer
	// runs (duration). It repairs what gossip missed: memberlist sends each
	// broadcast only RetransmitMult*ceil(log10(nodes+1)) times.
	PushPullInterval time.Duration
	// RetransmitMult scales how many times each broadcast is sent (count).
	RetransmitMult int
	// GossipToTheDeadTime is how long dead and left nodes are remembered
	// (and listed by Members) before they are forgotten (duration).
	GossipToTheDeadTime time.Duration
	// DeadNodeReclaimTime lets a node that died come back under its name at
	// a new address once it has been dead this long (duration). Zero, the
	// memberlist default, refuses a new address until the dead node is
	// forgotten; set it when restarted daemons get new IPs (Kubernetes pods).
	DeadNodeReclaimTime time.Duration
	// NoCompression turns off memberlist's LZW compression of gossip
	// packets (on by default). Compression does not let a packet carry more:
	// memberlist fills each packet up to its size limit before compressing
	// it, so it only saves bytes on the wire, and it costs a fresh 64 KiB
	// encoder table (and a decoder) per packet. That is noise for one node
	// per host, but a simulation of hundreds of nodes in one process spends
	// most of its CPU on it (docs/scale.md).
	NoCompression bool

	// Label names the cluster (memberlist's label): every gossip packet
	// and stream then carries it (as authenticated data when Keys are
	// set), and a node takes only those that carry its own label. Two
	// clusters with different labels never merge, whatever one node of
	// one contacts at an address of the other (a stale seed, a failed
	// member's address handed to another cluster's node); a node with a
	// label and one without do not talk either, so every node of a
	// cluster needs the same one. At most MaxLabel bytes. Default "": none.
	Label string

	// Keys is the gossip keyring, the primary first (see ParseKeys): each
	// 16, 24 or 32 bytes. With keys, every gossip packet and stream is
	// sealed with AES-GCM and only sealed ones are accepted. Default nil:
	// plaintext gossip, which anyone who reaches the port can join.
	Keys [][]byte

	// EventBuffer is the number of events each subscriber's channel holds
	// before the oldest is dropped (count). Default 256.
	EventBuffer int
	// Logger receives memberlist's log lines at their level and this
	// package's own. Default nil: discard.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration poold starts from: LAN profile,
// port 7946 on all addresses, the host name as node name, no seeds.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Name:        host,
		BindAddr:    "0.0.0.0",
		BindPort:    DefaultPort,
		Profile:     ProfileLAN,
		EventBuffer: 256,
	}
}

// Validate reports the first field out of range, wrapped in ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Name == "" {
		return bad("Name is empty; give the node a name unique in the cluster (default: the host name)")
	}
	if len(c.Name) > 128 {
		return bad("Name %q is %d bytes, at most 128", c.Name, len(c.Name))
	}
	if c.Transport == nil {
		if c.BindAddr != "" && net.ParseIP(c.BindAddr) == nil {
			return bad("BindAddr %q is not an IP address (use 0.0.0.0 for all)", c.BindAddr)
		}
		if c.BindPort < 0 || c.BindPort > 65535 {
			return bad("BindPort %d is not a port (0..65535, 0 = any free port)", c.BindPort)
		}
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		return bad("AdvertiseAddr %q is not an IP address", c.AdvertiseAddr)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return bad("AdvertisePort %d is not a port (0..65535, 0 = the bound port)", c.AdvertisePort)
	}
	for _, s := range c.Join {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return bad("Join seed %q is not host:port: %v", s, err)
		}
	}
	switch c.Profile {
	case "", ProfileLAN, ProfileLocal, ProfileWAN:
	default:
		return bad("Profile %q is not one of %q, %q, %q", c.Profile, ProfileLAN, ProfileLocal, ProfileWAN)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ProbeInterval", c.ProbeInterval}, {"ProbeTimeout", c.ProbeTimeout},
		{"GossipInterval", c.GossipInterval}, {"PushPullInterval", c.PushPullInterval},
		{"GossipToTheDeadTime", c.GossipToTheDeadTime}, {"DeadNodeReclaimTime", c.DeadNodeReclaimTime},
	} {
		if d.v < 0 {
			return bad("%s is %v; use a positive duration, or 0 for the default", d.name, d.v)
		}
	}
	for i, k := range c.Keys {
		if err := CheckKey(k); err != nil {
			return fmt.Errorf("%w: Keys[%d]: %w", ErrInvalidConfig, i, err)
		}
	}
	if len(c.Label) > MaxLabel {
		return bad("Label is %d bytes; use at most %d", len(c.Label), MaxLabel)
	}
	if c.SuspicionMult < 0 {
		return bad("SuspicionMult is %d; use a positive count, or 0 for the default", c.SuspicionMult)
	}
	if c.RetransmitMult < 0 {
		return bad("RetransmitMult is %d; use a positive count, or 0 for the default", c.RetransmitMult)
	}
	if c.EventBuffer < 0 {
		return bad("EventBuffer is %d; use a positive count, or 0 for the default", c.EventBuffer)
	}
	ml := c.profile()
	c.override(ml)
	if ml.ProbeTimeout >= ml.ProbeInterval {
		return bad("ProbeTimeout %v must be shorter than ProbeInterval %v", ml.ProbeTimeout, ml.ProbeInterval)
	}
	return nil
}

// profile returns a fresh memberlist configuration for c.Profile.
func (c Config) profile() *memberlist.Config {
	switch c.Profile {
	case ProfileLocal:
		return memberlist.DefaultLocalConfig()
	case ProfileWAN:
		return memberlist.DefaultWANConfig()
	default:
		return memberlist.DefaultLANConfig()
	}
}

// override applies c's non-zero overrides to ml.
func (c Config) override(ml *memberlist.Config) {
	set := func(dst *time.Duration, v time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	set(&ml.ProbeInterval, c.ProbeInterval)
	set(&ml.ProbeTimeout, c.ProbeTimeout)
	set(&ml.GossipInterval, c.GossipInterval)
	set(&ml.PushPullInterval, c.PushPullInterval)
	set(&ml.GossipToTheDeadTime, c.GossipToTheDeadTime)
	set(&ml.DeadNodeReclaimTime, c.DeadNodeReclaimTime)
	if c.SuspicionMult > 0 {
		ml.SuspicionMult = c.SuspicionMult
	}
	if c.RetransmitMult > 0 {
		ml.RetransmitMult = c.RetransmitMult
	}
	if c.NoCompression {
		ml.EnableCompression = false
	}
	ml.Label = c.Label
}

// withDefaults fills the fields whose zero value means "default".
func (c Config) withDefaults() Config {
	if c.BindAddr == "" {
		c.BindAddr = "0.0.0.0"
	}
	if c.Profile == "" {
		c.Profile = ProfileLAN
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = 256
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
