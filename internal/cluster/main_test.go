package cluster

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests. memberlist's
// Shutdown does not wait for a probe in flight: that goroutine waits for its
// ack timer (the probe interval times Lifeguard's awareness multiplier, a
// few seconds at most here) and then ends. goleak's own retries give up
// after about half a second, so goroutines get a bounded grace period
// first; a goroutine that never ends still fails the run.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(15 * time.Second)
		for goleak.Find() != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines still running 15 s after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
