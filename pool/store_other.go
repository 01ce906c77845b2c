//go:build !linux

package pool

// bootID is "" where the host's boot id is not read: the store then
// fsyncs its volatile file too (see store).
func bootID() string { return "" }
