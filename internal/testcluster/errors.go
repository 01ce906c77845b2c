package testcluster

import (
	"errors"
	"fmt"

	"github.com/farmem/farmem/internal/errs"
)

// The sentinels. Match them with errors.Is; every error the package returns
// wraps one of them with the value that was wrong.
var (
	// ErrInvalidOptions: an Options field is out of range or malformed.
	ErrInvalidOptions = errors.New("testcluster: invalid options")
	// ErrAddress: Dial or Listen was given something other than a literal
	// IP:port (host names would be resolved outside the namespace).
	ErrAddress = errors.New("testcluster: address must be a literal IP:port, e.g. 10.211.7.2:7000")
	// ErrNetwork: Dial, Listen or ListenPacket was given a network it does
	// not open.
	ErrNetwork = errors.New("testcluster: unsupported network; Dial takes tcp, tcp4, tcp6, udp, udp4 or udp6, Listen the tcp ones, ListenPacket the udp ones")
	// ErrNotSupported: network namespaces need Linux; it wraps
	// errs.ErrNotSupported so callers can match either.
	ErrNotSupported = fmt.Errorf("testcluster: network namespaces need Linux: %w", errs.ErrNotSupported)
	// ErrIP: an `ip` (iproute2) command failed; the error carries its
	// arguments and output.
	ErrIP = errors.New("testcluster: ip command failed")
	// ErrCommand: StartCmd was given a command it cannot take over: one
	// already started, or whose Stdout or Stderr is set (they are captured).
	ErrCommand = errors.New("testcluster: StartCmd needs an unstarted command from Host.Command with nil Stdout and Stderr")
	// ErrNotReady: a link did not come up, or a process did not print what was
	// awaited, before the deadline.
	ErrNotReady = errors.New("testcluster: not ready before the deadline")
)
