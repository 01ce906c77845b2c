package tcp

import (
	"time"

	"github.com/farmem/farmem/rdma"
)

// DefaultBusyPoll is how long a reader busy-polls its socket by default
// before it parks (ServerConfig.BusyPoll, WithBusyPoll): the value the
// kernel's documentation suggests for net.core.busy_poll with a few
// sockets.
const DefaultBusyPoll = 50 * time.Microsecond

// A reader busy-polls for one class of waits at a time (want says which),
// each class with a backoff of its own: on a connection to a home that
// forwards its changes to copies or parity shards, a write's answer comes
// after a second round trip, past the spin, while a read's comes within
// it, and one backoff would let the writes' misses stop the reads from
// polling for up to 256 reads after them.
const (
	noSpin    = iota // want: this read does not busy-poll (the zero value)
	spinRead         // waits for the answer to a READ
	spinOther        // waits for any other answer (writes, atomics, messages)

	spinClasses = spinOther // how many classes there are
)

// spinClassOf is the class of a wait for the answer to an op of kind k.
func spinClassOf(k rdma.OpKind) int {
	if k == rdma.OpRead {
		return spinRead
	}
	return spinOther
}

// loneRun is how many waits in a row must each have been for a lone
// request before a connection busy-polls: a peer at one request in flight
// makes every wait a lone one, a pipelining peer seldom many in a row.
const loneRun = 8

// streak counts the lone waits in a row, up to loneRun. It belongs to the
// goroutine that reads the connection.
type streak int

// note records one wait, alone or not.
func (s *streak) note(alone bool) {
	if alone {
		*s = min(*s+1, loneRun)
	} else {
		*s = 0
	}
}

// long reports whether the run is long enough to busy-poll.
func (s streak) long() bool { return s >= loneRun }
