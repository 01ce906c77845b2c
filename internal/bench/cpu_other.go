//go:build !linux

package bench

import (
	"fmt"
	"time"
)

// SelfCPU is this process's CPU time; unknown off Linux.
func SelfCPU() (time.Duration, error) {
	return 0, fmt.Errorf("%w: process CPU time is read with getrusage on Linux only", ErrUnknown)
}

// ProcessCPU is process pid's CPU time; unknown off Linux.
func ProcessCPU(pid int) (time.Duration, error) {
	return 0, fmt.Errorf("%w: CPU time of process %d is read from /proc on Linux only", ErrUnknown, pid)
}

// ListenerPID finds the process listening on addr; unknown off Linux.
func ListenerPID(addr string) (int, error) {
	return 0, fmt.Errorf("%w: finding the process behind %s reads /proc on Linux only", ErrUnknown, addr)
}
