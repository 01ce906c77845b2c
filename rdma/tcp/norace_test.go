//go:build !race

package tcp

// raceEnabled: the race detector is off.
const raceEnabled = false
