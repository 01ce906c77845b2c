package listener

import "time"

// warnings rate-limits one kind of log line: at most one per every, with
// the number of lines left out since the last one. Not safe for concurrent
// use; its owner locks.
type warnings struct {
	every      time.Duration
	last       time.Time
	suppressed int
}

// allow reports whether to log a line at now and, if so, how many were
// left out before it; if not, it counts the line as left out.
func (w *warnings) allow(now time.Time) (bool, int) {
	if !w.last.IsZero() && now.Sub(w.last) < w.every {
		w.suppressed++
		return false, 0
	}
	n := w.suppressed
	w.last, w.suppressed = now, 0
	return true, n
}

// flush returns the number of lines left out and forgets them.
func (w *warnings) flush() int {
	n := w.suppressed
	w.suppressed = 0
	return n
}
