package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Config says where a Proxy forwards and how it breaks connections. A
// plain value; ReplyBudget may be called from several goroutines.
type Config struct {
	// Target is the host:port that connections are forwarded to.
	Target string
	// ReplyBudget, when set, is called for each new connection and returns
	// how many bytes may flow from the target back to the client before
	// the proxy kills the connection; 0 means no limit. The bytes past the
	// budget are not delivered: whatever requests they answer reached the
	// target, but their replies are lost. Default: nil (no limit).
	ReplyBudget func() int
	// Record, when set, is called with every chunk of bytes the proxy
	// forwards, fromClient saying its direction, before it is delivered;
	// p is valid only during the call. It is called from both directions'
	// goroutines of every connection concurrently. Default: nil.
	Record func(fromClient bool, p []byte)
}

// Proxy forwards connections accepted on a loopback port to Config.Target.
// It is safe for concurrent use.
type Proxy struct {
	cfg Config
	ln  net.Listener

	mu     sync.Mutex
	pairs  map[*pair]struct{}
	closed bool
	wg     sync.WaitGroup
	stop   chan struct{}

	kills atomic.Int64
}

// pair is one forwarded connection: the client's side and the target's.
type pair struct {
	client, target net.Conn
	once           sync.Once
}

// Start listens on a loopback port and forwards what it accepts.
func Start(cfg Config) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{cfg: cfg, ln: ln, pairs: make(map[*pair]struct{}), stop: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Kills returns how many connections the proxy has killed.
func (p *Proxy) Kills() int64 { return p.kills.Load() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", p.cfg.Target)
		if err != nil {
			c.Close()
			continue
		}
		pr := &pair{client: c, target: t}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			t.Close()
			return
		}
		p.pairs[pr] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		budget := 0
		if p.cfg.ReplyBudget != nil {
			budget = p.cfg.ReplyBudget()
		}
		go p.forward(pr, c, t, 0)
		go p.forward(pr, t, c, budget)
	}
}

// forward copies from src to dst until either fails, or until budget bytes
// were copied (budget > 0); then it kills the pair.
func (p *Proxy) forward(pr *pair, src, dst net.Conn, budget int) {
	defer p.wg.Done()
	var r io.Reader = src
	if rec := p.cfg.Record; rec != nil {
		r = recorder{r: src, rec: rec, fromClient: src == pr.client}
	}
	var err error
	if budget > 0 {
		_, err = io.CopyN(dst, r, int64(budget))
		if err == nil {
			p.kill(pr)
			return
		}
	} else {
		_, err = io.Copy(dst, r)
	}
	// One side ended (or was killed): end the other so both copies stop.
	if !errors.Is(err, net.ErrClosed) {
		pr.close()
	}
	p.drop(pr)
}

// kill resets both sides of pr, as `ss -K` does to a socket.
func (p *Proxy) kill(pr *pair) {
	pr.once.Do(func() {
		p.kills.Add(1)
		for _, c := range []net.Conn{pr.client, pr.target} {
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // RST, not FIN: the peer's next read or write fails
			}
			c.Close()
		}
	})
	p.drop(pr)
}

// close ends both sides of a pair whose stream ended by itself.
func (pr *pair) close() {
	pr.once.Do(func() {
		pr.client.Close()
		pr.target.Close()
	})
}

func (p *Proxy) drop(pr *pair) {
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

// KillAll kills every connection the proxy carries now.
func (p *Proxy) KillAll() {
	p.mu.Lock()
	pairs := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		pairs = append(pairs, pr)
	}
	p.mu.Unlock()
	for _, pr := range pairs {
		p.kill(pr)
	}
}

// KillEvery kills every connection each period until Close.
func (p *Proxy) KillEvery(period time.Duration) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.KillAll()
			case <-p.stop:
				return
			}
		}
	}()
}

// Close stops accepting, kills every connection and waits for the proxy's
// goroutines. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.stop)
	p.mu.Unlock()
	err := p.ln.Close()
	p.KillAll()
	p.wg.Wait()
	return err
}

// recorder hands what it reads to Config.Record.
type recorder struct {
	r          io.Reader
	rec        func(fromClient bool, p []byte)
	fromClient bool
}

func (r recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.rec(r.fromClient, p[:n])
	}
	return n, err
}
