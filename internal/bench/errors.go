package bench

import "errors"

// ErrNotSupported reports an operation a system does not offer (a raw TCP
// server has no atomics); the generator skips such cases.
var ErrNotSupported = errors.New("bench: operation not supported by this system")

// ErrInvalid reports a bad argument: an unknown op, a size or depth out of
// range, a server address that cannot be used.
var ErrInvalid = errors.New("bench: invalid argument")

// ErrUnknown reports a figure the host cannot provide (CPU time of a
// process on a system without /proc).
var ErrUnknown = errors.New("bench: not measurable on this host")
