package verbs

import (
	"log/slog"
	"time"
)

// Config configures a Server. The zero value is usable.
type Config struct {
	// Authenticate checks the credential a peer presents in its hello; nil
	// accepts every peer (the per-segment 128-bit keys still guard the
	// memory). Default: nil.
	Authenticate func(cred []byte) error
	// Logger receives refused connections and setup failures. Default:
	// discard.
	Logger *slog.Logger
	// HandshakeTimeout bounds a peer's hello and queue-pair setup.
	// Default (0): 10s.
	HandshakeTimeout time.Duration
}
