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

// Slots count what each source holds (connections, usually) under a total
// and a per-source limit, and log refusals at most once per
// logsample.Interval with the number held back. Safe for concurrent use.
type Slots struct {
	lim Limits
	log *slog.Logger

	mu       sync.Mutex
	held     int
	bySource map[string]int
	warn     logsample.Sampler[string] // by message
}

// NewSlots returns empty slots; an error for limits out of range.
func NewSlots(lim Limits) (*Slots, error) {
	if lim.Name == "" || lim.Total < 1 || lim.PerSource < 1 || lim.PerSource > lim.Total {
		return nil, fmt.Errorf("listener: limits %q total %d per source %d: name them and use 1 <= per source <= total", lim.Name, lim.Total, lim.PerSource)
	}
	log := lim.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Slots{lim: lim, log: log, bySource: map[string]int{}}, nil
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
	s.warn.Log(s.log, slog.LevelWarn, msgRefused, msgRefused, "listener", s.lim.Name, "source", src,
		"held", held, "from-source", n, "limit", s.lim.Total, "limit-per-source", s.lim.PerSource)
	if s.lim.OnRefuse != nil {
		s.lim.OnRefuse(src)
	}
	return false
}

// msgRefused is the warning about a slot refused, and its key in
// Slots.warn: one line a second at most, whatever the source.
const msgRefused = "refused a connection: limit reached"

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
