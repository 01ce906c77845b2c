//go:build race

package tcp

// raceEnabled: the race detector is on, and sync.Pool drops some of what
// it is given, so allocation counts say nothing.
const raceEnabled = true
