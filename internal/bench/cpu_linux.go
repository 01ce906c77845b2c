//go:build linux

package bench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/procstat"
)

// SelfCPU is this process's CPU time so far, user plus system, over all
// its threads (getrusage RUSAGE_SELF: per-thread figures would miss the
// goroutines that ran on other threads).
func SelfCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// ProcessCPU is the CPU time so far of process pid: the sum over its
// threads of /proc/PID/task/TID/schedstat (nanoseconds), or, where
// schedstat is missing, utime+stime of /proc/PID/stat (clock ticks, 10 ms
// apart, too coarse for short runs).
func ProcessCPU(pid int) (time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("%w: CPU time of process %d: %w", ErrUnknown, pid, err)
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			if os.IsNotExist(err) {
				continue // the thread exited meanwhile
			}
			return statCPU(pid)
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return statCPU(pid)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return statCPU(pid)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// statCPU reads utime+stime from /proc/PID/stat.
func statCPU(pid int) (time.Duration, error) {
	f, err := procstat.Fields(pid)
	if err != nil {
		return 0, fmt.Errorf("%w: CPU time of process %d: %w", ErrUnknown, pid, err)
	}
	// utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%w: /proc/%d/stat has %d fields after the name", ErrUnknown, pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%w: /proc/%d/stat: utime %q stime %q", ErrUnknown, pid, f[11], f[12])
	}
	const hz = 100 // USER_HZ, fixed by the kernel ABI on Linux
	return time.Duration(ut+st) * time.Second / hz, nil
}

// ListenerPID finds the local process listening on addr (host:port, a
// loopback or local address): the socket's inode from /proc/net/tcp{,6},
// then the process holding it among /proc/*/fd. It needs the right to read
// the other process's fd directory (root, or the same user).
func ListenerPID(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("%w: address %q: %w", ErrInvalid, addr, err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%w: port %q of %s", ErrInvalid, p, addr)
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		listeningInodes(f, uint16(port), inodes)
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("%w: no local process listens on port %d", ErrUnknown, port)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnknown, err)
	}
	for _, pd := range procs {
		pid, err := strconv.Atoi(pd.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", pd.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join("/proc", pd.Name(), "fd", fd.Name()))
			if err == nil && strings.HasPrefix(l, "socket:[") && inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: port %d is listened on by a process this user cannot see (run as root or as its owner)", ErrUnknown, port)
}

// listeningInodes adds the inodes of sockets in LISTEN state on port
// listed in a /proc/net/tcp file.
func listeningInodes(file string, port uint16, into map[string]bool) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	want := fmt.Sprintf(":%04X", port)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fs) < 10 || fs[3] != "0A" || !strings.HasSuffix(fs[1], want) {
			continue
		}
		into[fs[9]] = true
	}
}
