package faultproxy

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"
)

// Recording keeps every byte a proxy forwards, per direction: pass its
// Record as Config.Record. Safe for concurrent use.
type Recording struct {
	mu                   sync.Mutex
	fromClient, toClient bytes.Buffer
}

// Record appends p to the direction's bytes.
func (r *Recording) Record(fromClient bool, p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fromClient {
		r.fromClient.Write(p)
	} else {
		r.toClient.Write(p)
	}
}

// Bytes returns copies of what the clients sent and what came back, each
// in the order forwarded (connections interleaved).
func (r *Recording) Bytes() (fromClient, toClient []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.fromClient.Bytes()), bytes.Clone(r.toClient.Bytes())
}

// Replay sends b to addr on a new connection, as an attacker replaying a
// capture would, and returns what comes back until the server closes the
// connection or wait passes.
func Replay(addr string, b []byte, wait time.Duration) ([]byte, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	go nc.Write(b) // the server may stop reading: the read below must not wait on it
	nc.SetReadDeadline(time.Now().Add(wait))
	var out bytes.Buffer
	io.Copy(&out, nc)
	return out.Bytes(), nil
}
