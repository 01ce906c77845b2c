package logsample

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Interval is the least time between two lines of one key.
const Interval = time.Second

// maxKeys bounds the keys a Sampler remembers, for keys an attacker may
// vary (a message's text, an identity): the memory stays bounded, and so
// do the lines, at maxKeys per Interval.
const maxKeys = 256

// Sampler lets through at most one log line per key per Interval and
// counts, per key, the lines it held back. It remembers at most maxKeys
// keys: when a new key finds them all taken, the keys without a line in
// the last Interval are forgotten (with the count they held back, which
// only their callers' metrics then keep); if none is, the new key shares
// one budget with the other keys that found no room. The zero value is
// ready and reads the wall clock. Safe for concurrent use.
type Sampler[K comparable] struct {
	mu       sync.Mutex
	now      func() time.Time // nil: time.Now
	keys     map[K]*budget
	overflow budget
	swept    time.Time // when the keys were last searched for stale ones
}

// budget is one key's: when its last line was let through, and how many
// were held back since.
type budget struct {
	last       time.Time
	suppressed int
}

// Take reports whether a line of key k may be logged now and, if so, how
// many lines of k were held back since its last one.
func (s *Sampler[K]) Take(k K) (suppressed int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.now != nil {
		now = s.now()
	}
	b := s.keys[k]
	if b == nil {
		b = s.add(k, now)
	}
	if !b.last.IsZero() && now.Sub(b.last) < Interval {
		b.suppressed++
		return 0, false
	}
	n := b.suppressed
	b.last, b.suppressed = now, 0
	return n, true
}

// Log logs msg with args to l at level if Take lets a line of key k
// through, with the number held back since k's last line
// (suppressed_since_last).
func (s *Sampler[K]) Log(l *slog.Logger, level slog.Level, k K, msg string, args ...any) {
	if n, ok := s.Take(k); ok {
		l.Log(context.Background(), level, msg, append(args, "suppressed_since_last", n)...)
	}
}

// Flush returns how many lines of key k were held back since its last
// one and forgets them, for a line outside the sample that ends a spell
// of k's lines and reports what they held back itself (a listener's
// "accepting again" after its sampled "accept failed"). k's next line is
// still held back within Interval of its last.
func (s *Sampler[K]) Flush(k K) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.keys[k]
	if b == nil {
		return 0
	}
	n := b.suppressed
	b.suppressed = 0
	return n
}

// add returns the budget of a key not remembered: a new one, unless
// maxKeys keys are remembered after forgetting those whose last line is
// an Interval old (searched for at most once per Interval), the shared
// overflow then.
func (s *Sampler[K]) add(k K, now time.Time) *budget {
	if s.keys == nil {
		s.keys = make(map[K]*budget)
	}
	if len(s.keys) >= maxKeys && now.Sub(s.swept) >= Interval {
		s.swept = now
		for old, b := range s.keys {
			if now.Sub(b.last) >= Interval {
				delete(s.keys, old)
			}
		}
	}
	if len(s.keys) >= maxKeys {
		return &s.overflow
	}
	b := new(budget)
	s.keys[k] = b
	return b
}

// SetClock makes s read now instead of the wall clock, so that tests can
// flood it within one Interval and then step past it.
func (s *Sampler[K]) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}
