package tcp

import "time"

// DefaultBusyPoll is how long a reader busy-polls its socket by default
// before it parks (ServerConfig.BusyPoll, WithBusyPoll): the value the
// kernel's documentation suggests for net.core.busy_poll with a few
// sockets.
const DefaultBusyPoll = 50 * time.Microsecond

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
