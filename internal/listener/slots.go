package listener

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/farmem/farmem/internal/logsample"
)

// Limits bound what Slots hand out.
type Limits struct {
	// Name labels the holder in logs, e.g. "control-plane". Required.
	Name string
	// Logger receives the refusal warnings, at most one per
	// logsample.Interval; nil discards them.
	Logger *slog.Logger
	// Total is the most slots held at once; >= 1.
	Total int
	// PerSource is the most slots one source holds at once;
	// 1 <= PerSource <= Total.
	PerSource int
	// OnRefuse is called (without locks held) for every slot refused; nil:
	// none.
	OnRefuse func(source string)
}

// limited is what Slots and Conns share: their limits, checked, and the
// sampled warnings. Its fields are set once by init; warn is safe for
// concurrent use.
type limited struct {
	lim  Limits
	log  *slog.Logger
	warn logsample.Sampler[string] // by message
}

// init checks lim and keeps it; an error for limits out of range.
func (l *limited) init(lim Limits) error {
	if lim.Name == "" || lim.Total < 1 || lim.PerSource < 1 || lim.PerSource > lim.Total {
		return fmt.Errorf("listener: limits %q total %d per source %d: name them and use 1 <= per source <= total", lim.Name, lim.Total, lim.PerSource)
	}
	l.lim, l.log = lim, lim.Logger
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// refuse logs (sampled) that src was refused while held were taken, n of
// them by src, and tells OnRefuse. No lock may be held.
func (l *limited) refuse(src string, held, n int) {
	l.warn.Log(l.log, slog.LevelWarn, msgRefused, msgRefused, "listener", l.lim.Name, "source", src,
		"held", held, "from-source", n, "limit", l.lim.Total, "limit-per-source", l.lim.PerSource)
	if l.lim.OnRefuse != nil {
		l.lim.OnRefuse(src)
	}
}

// msgRefused is the warning about a slot refused, and its key in
// limited.warn: one line a second at most, whatever the source.
const msgRefused = "refused a connection: limit reached"

// Slots count what each source holds (connections, usually) under a total
// and a per-source limit, and log refusals at most once per
// logsample.Interval with the number held back. Safe for concurrent use.
type Slots struct {
	limited

	mu       sync.Mutex
	held     int
	bySource map[string]int
}

// NewSlots returns empty slots; an error for limits out of range.
func NewSlots(lim Limits) (*Slots, error) {
	s := &Slots{bySource: map[string]int{}}
	if err := s.init(lim); err != nil {
		return nil, err
	}
	return s, nil
}

// Acquire takes a slot for src and reports whether there was one; the
// caller gives it back with Release.
func (s *Slots) Acquire(src string) bool {
	s.mu.Lock()
	n := s.bySource[src]
	if s.held < s.lim.Total && n < s.lim.PerSource {
		s.held++
		s.bySource[src] = n + 1
		s.mu.Unlock()
		return true
	}
	held := s.held
	s.mu.Unlock()
	s.refuse(src, held, n)
	return false
}

// Release gives back a slot src acquired.
func (s *Slots) Release(src string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held--
	if s.bySource[src]--; s.bySource[src] <= 0 {
		delete(s.bySource, src)
	}
}

// Held returns the number of slots held.
func (s *Slots) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}
