package coherence

import (
	"fmt"
	"time"
)

// Config configures a Directory or a Sharer. Start from DefaultConfig. A
// plain value; the state machines keep a copy.
type Config struct {
	// PageSize is the unit of coherence in bytes: a power of two from 512
	// to MaxData. Every sharer of a segment must use the directory's page
	// size. Default: 4096.
	PageSize int
	// Lease is how long a grant lets a sharer use its copy without hearing
	// from the home. A dead or partitioned sharer delays a writer by at most
	// this long. Default: 1s. Range: 10ms..1h.
	Lease time.Duration
	// Grace is how long a directory refuses grants after it starts, so that
	// leases granted by a previous incarnation (before a restart of the
	// home) run out first. Default: 0 (the pool passes its lease when it
	// restarts over existing segments).
	Grace time.Duration
}

// DefaultConfig returns the defaults: 4 KiB pages, 1s leases, no grace.
func DefaultConfig() Config {
	return Config{PageSize: 4096, Lease: time.Second}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.PageSize < 512 || c.PageSize > MaxData || c.PageSize&(c.PageSize-1) != 0 {
		return fmt.Errorf("coherence: page size %d: %w; use a power of two from 512 to %d (default 4096)", c.PageSize, ErrInvalid, MaxData)
	}
	if c.Lease < 10*time.Millisecond || c.Lease > time.Hour {
		return fmt.Errorf("coherence: lease %s: %w; use 10ms to 1h (default 1s)", c.Lease, ErrInvalid)
	}
	if c.Grace < 0 {
		return fmt.Errorf("coherence: grace %s is negative: %w", c.Grace, ErrInvalid)
	}
	return nil
}
