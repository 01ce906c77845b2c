package paths

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/farmem/farmem/internal/errs"
)

// ParseTarget reads the address of a poold as every client takes it
// (alloc.Dial, memctl --socket, memctl bench): "" for the default socket
// (Socket), a unix socket path, absolute or relative to the working
// directory, optionally written "unix://PATH" or "unix:PATH", or
// "tcp://HOST:PORT" for a daemon's TCP control plane. A unix path comes
// back absolute, so that what is shown and what a reconnect dials does not
// depend on the directory the process is in later. A bare HOST:PORT is
// refused rather than taken for a file of that name.
func ParseTarget(target string) (network, addr string, err error) {
	switch {
	case target == "":
		return unixPath(Socket())
	case strings.HasPrefix(target, "tcp://"):
		hp := strings.TrimPrefix(target, "tcp://")
		if _, _, err := net.SplitHostPort(hp); err != nil || strings.Contains(hp, "/") {
			return "", "", fmt.Errorf("%w: target %q: write tcp://HOST:PORT, e.g. tcp://10.0.0.5:7950 (a poold's --listen)", errs.ErrInvalid, target)
		}
		return "tcp", hp, nil
	case strings.HasPrefix(target, "unix://"):
		return unixPath(strings.TrimPrefix(target, "unix://"))
	case strings.HasPrefix(target, "unix:"):
		return unixPath(strings.TrimPrefix(target, "unix:"))
	case strings.Contains(target, "://"):
		return "", "", fmt.Errorf("%w: target %q: give a unix socket path, unix://PATH or tcp://HOST:PORT", errs.ErrInvalid, target)
	case looksLikeHostPort(target):
		return "", "", fmt.Errorf("%w: target %q looks like a TCP address: write tcp://%s (or ./%s for a socket file of that name)", errs.ErrInvalid, target, target, target)
	}
	return unixPath(target)
}

// unixPath makes a socket path absolute.
func unixPath(p string) (string, string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", "", fmt.Errorf("%w: unix socket path %q: give the path of poold's --socket", errs.ErrInvalid, p)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", "", fmt.Errorf("%w: unix socket path %q: %w", errs.ErrInvalid, p, err)
	}
	return "unix", abs, nil
}

// looksLikeHostPort reports whether s, which has no scheme, reads as
// HOST:PORT with a numeric port and no path separator.
func looksLikeHostPort(s string) bool {
	if strings.Contains(s, "/") {
		return false
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}
