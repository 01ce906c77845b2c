//go:build !race

package main

// raceFlags builds the daemons without the race detector when the tests run
// without it: the measurements (TestEvacuateUnderLoad with
// FARMEM_TEST_EVAC_BYTES, the move figures) then time poold as it ships.
var raceFlags []string
