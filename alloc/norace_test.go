//go:build !race

package alloc

// raceEnabled: the race detector is on (see race_test.go).
const raceEnabled = false
