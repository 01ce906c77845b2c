//go:build race

package pool

// raceEnabled says the race detector is on: the scale simulation then
// runs its workload at half the rate.
const raceEnabled = true
