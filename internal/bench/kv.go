package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/redis/go-redis/v9"
)

// The memcached and Redis systems use the drivers applications use
// (bradfitz/gomemcache, redis/go-redis), each in-flight op on a connection
// of its own from the driver's pool: at depth 16, 16 concurrent clients,
// which is how those servers are run. Neither driver pipelines a lone
// caller's GETs, and neither do the applications that use them.

// keyNames names the Keys keys of a case: prefix-size-k.
func keyNames(prefix string, size int) (k [Keys]string) {
	for i := range k {
		k[i] = prefix + "-" + strconv.Itoa(size) + "-" + strconv.Itoa(i)
	}
	return k
}

// serverPID finds the local process behind addr, 0 if there is none to
// be seen.
func serverPID(addr string) int {
	pid, err := ListenerPID(addr)
	if err != nil {
		return 0
	}
	return pid
}

// Memcached drives a memcached server: GET, SET and incr. Safe for
// concurrent use.
type Memcached struct {
	c    *memcache.Client
	pid  int
	keys [Keys]string
}

var _ System = (*Memcached)(nil)

// NewMemcached connects to the memcached at addr (host:port), allowing up
// to maxConns connections (the deepest case's depth).
func NewMemcached(ctx context.Context, addr string, maxConns int) (*Memcached, error) {
	c := memcache.New(addr)
	c.MaxIdleConns = maxConns
	c.Timeout = 5 * time.Second
	if err := c.Ping(); err != nil {
		return nil, fmt.Errorf("memcached at %s does not answer: %w (start it with 'memcached -l 127.0.0.1 -p PORT', or leave out --memcached)", addr, err)
	}
	return &Memcached{c: c, pid: serverPID(addr)}, nil
}

// Name is "memcached".
func (m *Memcached) Name() string { return "memcached" }

// Prepare SETs the Keys values (or counters) a read (or atomic) case
// touches.
func (m *Memcached) Prepare(_ context.Context, op Op, size int) error {
	m.keys = keyNames("fm-bench", size)
	if op == Write {
		return nil // the case's SETs create the keys
	}
	val := make([]byte, size)
	if op == Atomic {
		val = []byte("0")
	}
	for _, k := range m.keys {
		if err := m.c.Set(&memcache.Item{Key: k, Value: val}); err != nil {
			return fmt.Errorf("memcached SET %s of %d B: %w (is its item size limit, -I, large enough?)", k, len(val), err)
		}
	}
	return nil
}

// Do GETs, SETs or increments one key.
func (m *Memcached) Do(_ context.Context, op Op, key int, buf []byte) error {
	switch op {
	case Read:
		it, err := m.c.Get(m.keys[key])
		if err != nil {
			return err
		}
		copy(buf, it.Value)
		return nil
	case Write:
		return m.c.Set(&memcache.Item{Key: m.keys[key], Value: buf})
	}
	_, err := m.c.Increment(m.keys[key], 1)
	return err
}

// ServerPID is the memcached process when it runs on this host.
func (m *Memcached) ServerPID() int { return m.pid }

// Close closes the driver's connections.
func (m *Memcached) Close() error { return m.c.Close() }

// Redis drives a Redis server: GET, SET and INCR. Safe for concurrent use.
type Redis struct {
	c    *redis.Client
	pid  int
	keys [Keys]string
}

var _ System = (*Redis)(nil)

// NewRedis connects to the Redis at addr (host:port), allowing up to
// maxConns connections (the deepest case's depth).
func NewRedis(ctx context.Context, addr string, maxConns int) (*Redis, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: maxConns, Protocol: 2, DisableIdentity: true})
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis at %s does not answer: %w (start it with 'redis-server --port PORT --bind 127.0.0.1', or leave out --redis)", addr, err)
	}
	return &Redis{c: c, pid: serverPID(addr)}, nil
}

// Name is "redis".
func (r *Redis) Name() string { return "redis" }

// Prepare SETs the Keys values (or counters) a read (or atomic) case
// touches.
func (r *Redis) Prepare(ctx context.Context, op Op, size int) error {
	r.keys = keyNames("fm-bench", size)
	if op == Write {
		return nil // the case's SETs create the keys
	}
	var val any = make([]byte, size)
	if op == Atomic {
		val = 0
	}
	for _, k := range r.keys {
		if err := r.c.Set(ctx, k, val, 0).Err(); err != nil {
			return fmt.Errorf("redis SET %s: %w", k, err)
		}
	}
	return nil
}

// Do GETs, SETs or INCRs one key.
func (r *Redis) Do(ctx context.Context, op Op, key int, buf []byte) error {
	switch op {
	case Read:
		b, err := r.c.Get(ctx, r.keys[key]).Bytes()
		if err != nil {
			return err
		}
		copy(buf, b)
		return nil
	case Write:
		return r.c.Set(ctx, r.keys[key], buf, 0).Err()
	}
	return r.c.Incr(ctx, r.keys[key]).Err()
}

// ServerPID is the redis-server process when it runs on this host.
func (r *Redis) ServerPID() int { return r.pid }

// Close closes the driver's connections.
func (r *Redis) Close() error { return r.c.Close() }
