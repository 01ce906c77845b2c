package probe

import "errors"

// ErrSpan reports a span or size too small to probe.
var ErrSpan = errors.New("probe: span too small")
