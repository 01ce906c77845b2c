//go:build !amd64

package mmap

// FlushMethod is "" where Flush cannot write cache lines back.
func FlushMethod() string { return "" }

// Flush fails with a *NotSupportedError: writing cache lines back from user
// space is implemented for x86-64 only (arm64's DC CVAP is not yet).
func Flush([]byte) error {
	return &NotSupportedError{Op: "cache-line write-back", Reason: "implemented for x86-64 only"}
}
