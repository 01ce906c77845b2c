package cluster

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// The member states, re-exported from memberlist so callers need not import it.
const (
	// StateAlive: the node answers probes (or has not been caught failing yet).
	StateAlive = memberlist.StateAlive
	// StateSuspect: memberlist suspects the node. memberlist v0.7.0 does not
	// tell delegates about suspicion, so this package never reports it; it is
	// listed so that code written against it keeps working if memberlist
	// starts to.
	StateSuspect = memberlist.StateSuspect
	// StateDead: the failure detector declared the node dead.
	StateDead = memberlist.StateDead
	// StateLeft: the node announced Leave and is gone.
	StateLeft = memberlist.StateLeft
)

// StateString names a member state: "alive", "suspect", "dead" or "left".
func StateString(s memberlist.NodeStateType) string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	default:
		return "unknown"
	}
}

// Member is one node as this node sees it. A value: the Cluster hands out
// copies (Meta.Tiers included), safe to keep and modify.
type Member struct {
	// Name is the node's unique name.
	Name string
	// Addr is the node's gossip address, host:port.
	Addr string
	// State is StateAlive, StateDead or StateLeft (see StateSuspect).
	State memberlist.NodeStateType
	// Since is when this node saw State change, by its local clock.
	Since time.Time
	// Boot is random per Cluster instance: a new value means the node's
	// daemon restarted (and lost what it held in volatile memory). 0 if
	// MetaErr is set.
	Boot uint64
	// Leaving is set once the node announced Leave; Pick skips it.
	Leaving bool
	// Meta is the node's decoded metadata; zero if MetaErr is set.
	Meta Meta
	// MetaAt is when this node last applied a change of Meta (a new Meta
	// or a capacity update), by its local clock. The scale simulation
	// times convergence with it.
	MetaAt time.Time
	// MetaErr is non-nil (wrapping ErrBadMeta) when the node's metadata does
	// not decode; such a node is listed but never used for placement.
	MetaErr error
}

// Usable reports whether Pick may place on m (tier and size aside): alive,
// readable metadata, neither draining nor leaving.
func (m Member) Usable() bool {
	return m.State == StateAlive && m.MetaErr == nil && !m.Meta.Draining && !m.Leaving
}

func (m Member) clone() Member {
	m.Meta = m.Meta.Clone()
	return m
}

func deadOrLeft(s memberlist.NodeStateType) bool { return s == StateDead || s == StateLeft }
