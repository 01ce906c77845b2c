package tcp

import (
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/rdma"
)

// Life of an op. Transitions are CAS on op.state:
//
//	queued ──flusher──▶ sending ──flusher──▶ sent ──reader──▶ receiving ──▶ done
//	  │                    └──────reader (response overtook the flusher)──▶ receiving
//	  └─caller gives up──▶ cancelled (never sent)
//	sent ──caller gives up──▶ abandoned (reader discards the response)
//
// A caller that gives up while its op is sending waits for that writev (the
// payload of a WRITE is the caller's buffer), and one that gives up while its
// op is receiving waits for the payload (the destination of a READ is the
// caller's buffer); so no buffer is touched after its call returned.
const (
	opQueued uint32 = iota + 1
	opSending
	opSent
	opReceiving
	opDone
	opCancelled
	opAbandoned
)

// op is one in-flight request. ops are pooled; refs counts the holders
// (caller, flusher, slot table) and the last release returns it to the pool.
type op struct {
	kind   rdma.OpKind
	region rdma.Region
	off    uint64
	buf    []byte
	arg0   uint64
	arg1   uint64
	req    []byte       // MSG request payload; buf receives the response
	n      int          // MSG response length
	once   *rdma.Ticket // exactly-once ticket, or nil
	retry  bool         // the ticket was posted before
	origin []byte       // a forwarded op's origin block (reqFlagForward), or nil
	unsent bool         // the connection failed before the request was written

	conn  *cliConn      // set by Client.post for Do
	id    atomic.Uint64 // atomic: a reader may load a stale op from a slot that fail just swept, whose next use sets it
	slot  uint32
	state atomic.Uint32
	refs  atomic.Int32
	done  chan struct{} // capacity 1; receives exactly one signal per use, or none

	prev    uint64
	swapped bool
	err     error
}

var opPool = sync.Pool{New: func() any { return &op{done: make(chan struct{}, 1)} }}

// getOp returns a clean op holding the caller's reference.
func getOp() *op {
	o := opPool.Get().(*op)
	o.refs.Store(1)
	return o
}

func (o *op) release() {
	if o.refs.Add(-1) == 0 {
		o.buf, o.req, o.n = nil, nil, 0
		o.once, o.retry, o.origin, o.unsent = nil, false, nil, false
		o.err = nil
		o.conn = nil
		o.prev, o.swapped = 0, false
		o.state.Store(0)
		opPool.Put(o)
	}
}
