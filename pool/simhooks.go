package pool

import (
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"

	"github.com/farmem/farmem/internal/cluster"
)

// simHooks let this package's tests run hundreds of daemons in one process
// (scale_linux_test.go, simcluster_linux_test.go) through the daemon's own code: the zero value is what
// poold runs, and no flag or YAML key sets them. They are a plain value,
// copied with the Config.
type simHooks struct {
	// cluster adjusts the gossip configuration before the node starts, e.g.
	// an in-memory transport (internal/cluster/memnet) instead of UDP and
	// TCP sockets, or other timing; an error fails the daemon's start.
	cluster func(*cluster.Config) error
	// grpc are extra options for both control-plane gRPC servers (unix
	// socket and Listen), e.g. interceptors that count calls.
	grpc []grpc.ServerOption
	// uevents opens the source of the kernel's device events instead of
	// the netlink socket, e.g. a feed of synthetic events.
	uevents func() (ueventSource, error)
	// announced runs when a move this daemon drives has announced its
	// switch-over (Stat names the target), before the commit is
	// submitted; true stops the move there, as if the daemon died: no
	// commit, no retry, nothing undone (a test then crashes the daemon
	// and restarts it from its store).
	announced func(segment uint64) (crash bool)
	// newHomeLost runs when the finish of a home move this daemon drives
	// finds its new home lost (or unreachable) and the segment lost
	// without it, before the leaving home is put back (keepLeaving); true
	// stops that try there, as if the daemon died (a test then crashes
	// the daemon and restarts it from its store; a retry meanwhile runs
	// the hook again).
	newHomeLost func(segment uint64) (crash bool)
	// sealAnswered runs when the source of a move this daemon drives
	// answered its SEAL, before the switch-over is announced; an error
	// fails the move there, as a SEAL whose answer was lost would.
	sealAnswered func(segment uint64) error
	// moveOutStep runs when this daemon, a move's source, is asked a
	// MoveOut step by c, before it runs it; an error refuses the step.
	moveOutStep func(c caller, req *poolv1.MoveOutRequest) error
	// moveOutRecheck runs when a MoveOut step req is about to check
	// again, under p.handing, that its move or fill is still the
	// segment's, before it takes chunks, seals or unseals (whileCurrent);
	// it runs before p.handing is taken.
	moveOutRecheck func(req *poolv1.MoveOutRequest)
	// judging runs when homeChanged is about to judge a change of node's
	// redundant homes, under node's judge lock.
	judging func(node string, up bool)
	// repairing runs when a rebuild this daemon drives is about to write
	// parity shard shard of segment back in line with the data shards
	// (the sealed round's repair, rebuildfill.go); an error fails that
	// write, as a home that refused it would.
	repairing func(segment uint64, shard int) error
	// placed runs when a rebuild or a home move this daemon drives has
	// made new home h of segment at h.Node, before the record or the
	// move's intent names it (placeHome, for placeRebuild and moveHome).
	placed func(segment uint64, h homeRef)
	// sessionBound runs when a new session's client id has been bound to
	// the caller's identity, before the session counts for the client's
	// lease (openSession).
	sessionBound func(clientID string)
	// revoking runs when an allocation whose segment the data plane
	// exported is undone (unplace), before the export is revoked; p.mu is
	// not held.
	revoking func(segment uint64)
	// forwarding runs when a Replicate has set a segment's forwarding on
	// the data plane, before it records the forwarding's connections; it
	// holds the segment's fwd.settingOf lock, not p.mu.
	forwarding func(segment uint64)
}
