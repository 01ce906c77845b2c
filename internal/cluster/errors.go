package cluster

import (
	"errors"
	"fmt"
	"strings"

	"github.com/farmem/farmem/internal/errs"
)

// ErrNoPeer is the one condition a client acts on and matches
// errs.ErrNoCapacity. The others stay this package's own: they report the
// daemon's configuration, keys and gossip, which the daemon handles itself
// or wraps in the farmem sentinel of its request (errs.ErrInvalid for a
// keyring change) where one reaches a client.

// ErrInvalidConfig means a Config field is out of range. The wrapping error
// names the field and the value; fix the daemon configuration.
var ErrInvalidConfig = errors.New("cluster: invalid configuration")

// ErrBadKey means a gossip key or key file cannot be used: a key that is
// not base64 of 16, 24 or 32 bytes, an empty file, too many keys, or a
// keyring change that would leave the node unable to gossip. The wrapping
// error names the line or the key's fingerprint.
var ErrBadKey = errors.New("cluster: bad gossip key")

// ErrInvalidMeta means a Meta value breaks a limit of the gossip encoding
// (tier name, address, tier count, negative or inconsistent byte counts). The
// wrapping error names the field; SetMeta and New refuse such a Meta and keep
// gossiping the previous one.
var ErrInvalidMeta = errors.New("cluster: invalid node metadata")

// ErrMetaTooLarge means the encoded Meta does not fit memberlist's node
// metadata limit (memberlist.MetaMaxSize, 512 bytes). It is refused, never
// truncated: gossip fewer tiers or shorter addresses.
var ErrMetaTooLarge = errors.New("cluster: node metadata exceeds memberlist's 512-byte limit; gossip fewer tiers or shorter addresses")

// ErrBadMeta means bytes received from a peer are not a Meta this version can
// read (unknown format version, truncated, or breaking a limit). The peer is
// listed with Member.MetaErr set and is never chosen by Pick; check that every
// node runs a compatible farmem version.
var ErrBadMeta = errors.New("cluster: peer metadata does not decode; check that every node runs a compatible farmem version")

// ErrClosed means the Cluster was shut down. Create a new Cluster (same
// name) to take part in gossip again.
var ErrClosed = errors.New("cluster: node has shut down; create a new Cluster to rejoin")

// ErrLeft means the node announced Leave: it keeps answering gossip until
// Shutdown but no longer accepts metadata changes. Shut it down and create a
// new Cluster to rejoin.
var ErrLeft = errors.New("cluster: node has left the cluster; Shutdown it and create a new Cluster to rejoin")

// ErrNoSeed means Join reached none of the seeds before its context ended.
// Check the seed addresses and that a poold gossips there (default port 7946,
// UDP and TCP).
var ErrNoSeed = errors.New("cluster: no seed reachable; check the seed addresses and that a poold gossips there (default port 7946, UDP and TCP)")

// ErrUpdateLost means memberlist dropped a metadata update again and again
// because the node kept refuting suspicions at that very moment (an
// overloaded or partitioned node). The new Meta is not in effect; call
// SetMeta again.
var ErrUpdateLost = errors.New("cluster: memberlist dropped the metadata update while the node refuted suspicions (is it overloaded?); call SetMeta again")

// ErrNoPeer means no member can take the allocation. The error Pick
// returns is a *NoPeerError that says why. It matches errs.ErrNoCapacity,
// so the daemon reports it as capacity when no other tier has room.
var ErrNoPeer = errs.Sub(errs.ErrNoCapacity, "cluster: no peer can take the allocation")

// NoPeerReason says why Pick found no member.
type NoPeerReason uint8

// The reasons Pick gives, from "nobody is there" to "nobody has room".
const (
	// NoAlivePeer: no member other than the excluded one is Alive with readable metadata.
	NoAlivePeer NoPeerReason = iota + 1
	// AllDraining: alive peers exist but all are draining or leaving.
	AllDraining
	// NoPeerWithTier: no alive, non-draining peer offers the tier.
	NoPeerWithTier
	// NotEnoughFree: peers offer the tier but none has size bytes free.
	NotEnoughFree
	// InvalidRequest: the size is negative or the tier name empty.
	InvalidRequest
)

// String returns the reason as the words used in NoPeerError's message.
func (r NoPeerReason) String() string {
	switch r {
	case NoAlivePeer:
		return "no alive peer"
	case AllDraining:
		return "all alive peers are draining or leaving"
	case NoPeerWithTier:
		return "no alive peer offers the tier"
	case NotEnoughFree:
		return "no peer has enough free bytes"
	case InvalidRequest:
		return "invalid request"
	default:
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
}

// NoPeerError is what Pick returns when no member fits. It matches ErrNoPeer
// and errs.ErrNoCapacity with errors.Is. Immutable once returned; safe to
// share between goroutines.
type NoPeerError struct {
	Tier     string       // tier asked for
	Size     int64        // bytes asked for
	Reason   NoPeerReason // why nobody fits
	Alive    int          // alive peers with readable metadata (excluding the excluded node)
	Usable   int          // of those, not draining nor leaving
	WithTier int          // of those, offering Tier
	MaxFree  int64        // most free bytes on Tier among usable peers (0 if none)
	MaxNode  string       // the peer with MaxFree
}

// Error says what was asked for, why nobody fits, and what to do.
func (e *NoPeerError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: no peer for %d bytes on tier %q: %s", e.Size, e.Tier, e.Reason)
	switch e.Reason {
	case NoAlivePeer:
		b.WriteString("; join more nodes (memctl nodes lists them) or use a local tier")
	case AllDraining:
		fmt.Fprintf(&b, " (%d alive); undrain a node with memctl or use a local tier", e.Alive)
	case NoPeerWithTier:
		fmt.Fprintf(&b, " (%d usable peers); start poold with that tier on another host", e.Usable)
	case NotEnoughFree:
		fmt.Fprintf(&b, " (%d peers offer it, most free %d bytes on %s); free segments or ask for less", e.WithTier, e.MaxFree, e.MaxNode)
	case InvalidRequest:
		b.WriteString("; pass a non-negative size and a tier name")
	}
	return b.String()
}

// Unwrap returns ErrNoPeer, so errors.Is matches it and, through it,
// errs.ErrNoCapacity.
func (e *NoPeerError) Unwrap() error { return ErrNoPeer }
