package alloc

import (
	"crypto/tls"
	"fmt"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// DialOption configures Dial. Options are immutable values, safe to share.
type DialOption func(*dialOptions)

type dialOptions struct {
	tls        *tls.Config
	clientID   string
	clientName string
	timeout    time.Duration
	opTimeout  time.Duration
	emulate    *string // WithEmulateLatency's spec, parsed by Dial
	busyPoll   time.Duration
	// dataAddr, when set, maps a data-plane address to the one dialed;
	// tests route the data plane through a fault-injecting proxy with it.
	dataAddr func(string) string
	// noReadAhead turns read-ahead off (WithReadAhead).
	noReadAhead bool
	// failover is WithFailoverTimeout's bound.
	failover time.Duration
	// api, when set, wraps the daemon's API client; tests make its calls
	// fail after the daemon acted on them.
	api func(poolv1.PoolClient) poolv1.PoolClient
}

// WithEmulateLatency sets latency emulation for this client, overriding
// the daemon's --emulate-latency for the tiers the spec names ("cxl=0"
// turns the daemon's off for cxl): ReadAt, WriteAt and the 64-bit atomics
// on a segment of such a tier take the latency plus size/bandwidth, e.g.
// "cxl=200ns,rdma=2us/12GB/s". It lets a program see how it would behave
// with hardware this host lacks. Loads and stores through Segment.Bytes
// cannot be slowed. A call whose real cost exceeds the target is not
// slowed further. Dial returns ErrInvalid, saying what to write instead,
// for a spec it cannot read. Default: the daemon's setting.
func WithEmulateLatency(spec string) DialOption {
	return func(o *dialOptions) { o.emulate = &spec }
}

// WithTLS makes Dial to a tcp:// target use mutual TLS with cfg: the
// client's certificate (whose common name is the identity poold sees) and
// the CA that the daemon's certificate must chain to. The daemon's
// certificate is checked for the host in the target unless cfg.ServerName
// says otherwise. LoadTLS makes one; any tls.Config
// with Certificates and RootCAs will do. Default: nil, plaintext, which a
// daemon accepts only with --insecure. A unix socket target ignores it.
func WithTLS(cfg *tls.Config) DialOption { return func(o *dialOptions) { o.tls = cfg } }

// WithOpTimeout bounds each ReadAt, WriteAt and atomic on an rdma segment,
// retries included, while its home is unreachable but not reported lost.
// Default: 30s.
func WithOpTimeout(d time.Duration) DialOption { return func(o *dialOptions) { o.opTimeout = d } }

// WithFailoverTimeout bounds how long an operation on a redundant segment
// (WithRedundancy) waits for one home that neither answers nor fails:
// then a read tries the next copy or decodes the shard from others, and a
// write or atomic asks the daemon for the segment's primary and goes on
// there. Set it to about the pool's failure-detection time (poold
// --gossip-profile: 1s for local, a few seconds for lan). A home that
// fails outright (its connection refused or reset) is left at once.
// Default: 2s.
func WithFailoverTimeout(d time.Duration) DialOption {
	return func(o *dialOptions) { o.failover = d }
}

// WithBusyPoll sets how long an operation on an rdma or shared segment
// reached over TCP busy-polls the socket for its answer before it sleeps,
// once operations to that host have been going one at a time: a round
// trip then costs no wake-up (two context switches) for the CPU time
// spent polling (README, "memctl bench", has the measured difference). It
// backs off when answers do not come within it or the cores are busy, and
// at most half the cores (GOMAXPROCS/2) poll at once. The daemon polls
// likewise for the next request (poold --data-busy-poll). Default: 50µs.
// Zero or negative: off.
func WithBusyPoll(d time.Duration) DialOption { return func(o *dialOptions) { o.busyPoll = d } }

// WithClientID sets the client's stable identity. A restarted application
// that dials with the same id within the lease TTL keeps its unnamed
// segments. Default: a random id, new on every Dial.
func WithClientID(id string) DialOption { return func(o *dialOptions) { o.clientID = id } }

// WithClientName sets a free-text name memctl shows for the client, at
// most 255 bytes (Dial fails with ErrInvalid beyond). Default: the
// program's name.
func WithClientName(name string) DialOption { return func(o *dialOptions) { o.clientName = name } }

// WithDialTimeout bounds how long Dial waits for the daemon when ctx has
// no deadline, and how long a later call without a deadline waits for the
// client to reconnect to a restarted daemon before it fails with
// ErrUnavailable. Default: 5s.
func WithDialTimeout(d time.Duration) DialOption { return func(o *dialOptions) { o.timeout = d } }

// AllocOption configures one Alloc. Options are immutable values, safe to share.
type AllocOption func(*allocConfig)

// allocConfig is what an Alloc's options ask for; request turns it into
// the daemon's request.
type allocConfig struct {
	tier      Tier
	fallback  []Tier
	name      string
	allow     []string // identities that may attach the named segment
	allowFree []string // identities that may attach and free it
	persist   bool
	populate  bool
	badTier   []Tier // tiers named that do not exist
	// The budget, nil when not asked for (WithMaxLatency, WithMinBandwidth).
	maxLatency   *time.Duration
	minBandwidth *int64
	// redundancy is WithRedundancy's, nil when not asked for.
	redundancy *Redundancy
	// fresh is set by Alloc: the segment is this client's new allocation
	// (not attached or reopened), which read-ahead needs (heldAlone).
	fresh bool
}

// checked returns t, noting it when it names no tier.
func (o *allocConfig) checked(t Tier) Tier {
	if t < TierAny || t > TierRDMA {
		o.badTier = append(o.badTier, t)
	}
	return t
}

// request is the daemon's request for a segment of size bytes as o asks,
// or ErrInvalid when an option named a tier that does not exist.
func (o *allocConfig) request(size int64) (*poolv1.AllocRequest, error) {
	if len(o.badTier) > 0 {
		return nil, fmt.Errorf("%w: unknown tier %s; use TierLocal, TierCXL, TierRDMA or TierAny", ErrInvalid, o.badTier[0])
	}
	r := &poolv1.AllocRequest{Size: size, Tier: o.tier.proto(), Name: o.name, Allow: o.allow, AllowFree: o.allowFree, Persist: o.persist}
	if d := o.maxLatency; d != nil {
		if *d <= 0 {
			return nil, fmt.Errorf("%w: WithMaxLatency(%s): a latency budget must be positive, e.g. 2*time.Microsecond; leave the option out for none", ErrInvalid, *d)
		}
		r.MaxReadLatencyNs = d.Nanoseconds()
	}
	if b := o.minBandwidth; b != nil {
		if *b <= 0 {
			return nil, fmt.Errorf("%w: WithMinBandwidth(%d): a bandwidth budget must be positive bytes per second, e.g. 1e9; leave the option out for none", ErrInvalid, *b)
		}
		r.MinReadBandwidthBps = *b
	}
	for _, t := range o.fallback {
		r.Fallback = append(r.Fallback, t.proto())
	}
	if err := o.checkRedundancy(r); err != nil {
		return nil, err
	}
	return r, nil
}

// WithTier asks for a tier. Default: TierAny. A caller that asks for a tier
// gets that tier or ErrNoCapacity, never silently another, unless it also
// passes WithFallback.
func WithTier(t Tier) AllocOption {
	return func(o *allocConfig) { o.tier = o.checked(t) }
}

// WithFallback lists tiers to try, in order, when the asked tier is full.
// The returned segment's Tier says which one it got.
func WithFallback(tiers ...Tier) AllocOption {
	return func(o *allocConfig) {
		for _, t := range tiers {
			o.fallback = append(o.fallback, o.checked(t))
		}
	}
}

// WithMaxLatency places the segment only on a tier whose read latency
// p50 is at most d, the cheapest such tier first: rdma (memory other hosts
// spare), then cxl, then local DRAM, the most precious (README, Tiers). A
// tier is judged by the figure memctl tiers shows: the injected latency
// where poold emulates one (--emulate-latency; a client's own
// WithEmulateLatency does not change placement), else what poold measured
// at start, else the firmware's (HMAT); a tier without a figure meets no
// budget. With WithTier the named tier and its fallbacks are tried in
// their order, those over budget left out. When no tier meets it, Alloc
// fails with ErrOverBudget (which matches ErrNoCapacity too), naming the
// best tier and its latency. Segment.Placement says what the segment was
// judged by. Zero or negative d: ErrInvalid. Default: no bound.
func WithMaxLatency(d time.Duration) AllocOption {
	return func(o *allocConfig) { o.maxLatency = &d }
}

// WithMinBandwidth places the segment only on a tier whose read bandwidth
// is at least bps bytes per second: the injected cap where poold emulates
// one and it is lower, else what poold measured. It combines with
// WithMaxLatency (both must hold) and otherwise works as it does. Zero or
// negative bps: ErrInvalid. Default: no bound.
func WithMinBandwidth(bps int64) AllocOption {
	return func(o *allocConfig) { o.minBandwidth = &bps }
}

// WithName gives the segment a unique name: it outlives its creator's
// session until freed, and clients of the creator's identity (uid:N on the
// unix socket, cn:NAME of the client certificate over TLS) and of the
// identities grants name can Attach it. Default grants: none, so only the
// creator's identity (and administrators) can attach it, and only the
// creator's identity and administrators can free it.
func WithName(name string, grants ...Grant) AllocOption {
	return func(o *allocConfig) {
		o.name = name
		for _, g := range grants {
			g(o)
		}
	}
}

// Grant opens a named segment to identities besides its creator's (see
// WithName). Grants are immutable values, safe to share.
type Grant func(*allocConfig)

// AllowIdentity lets the identities attach the named segment (read,
// write, atomics), not free it. An identity is "uid:N" (a local process
// of uid N), "gid:N" (a local process whose primary gid is N) or
// "cn:NAME" (a client whose TLS certificate's common name is NAME); every
// process with that identity gets the same rights. Alloc fails with
// ErrInvalid for another form.
func AllowIdentity(ids ...string) Grant {
	return func(o *allocConfig) { o.allow = append(o.allow, ids...) }
}

// AllowFree lets the identities attach the named segment and free it too.
func AllowFree(ids ...string) Grant {
	return func(o *allocConfig) { o.allowFree = append(o.allowFree, ids...) }
}

// WithPersist keeps an unnamed segment after its creator's session ends,
// until freed. Default: false; the segment is reclaimed one lease TTL after
// its creator goes away. On memory that survives a power loss (a pmem CXL
// region's devdax device, an emulated device on a disk filesystem; see
// Segment.Durability) the segment then outlives the host's power too: its
// record is fsynced, and its bytes are durable once Segment.Persist covers
// them.
func WithPersist() AllocOption {
	return func(o *allocConfig) { o.persist = true }
}

// WithPopulate faults the whole segment in at map time, paying for page
// faults once instead of on first touch. Default: false.
func WithPopulate() AllocOption {
	return func(o *allocConfig) { o.populate = true }
}
