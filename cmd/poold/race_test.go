//go:build race

package main

// raceFlags builds the daemons these tests run with the race detector when
// the tests themselves run with it (CI), so a data race in poold fails them.
var raceFlags = []string{"-race"}
