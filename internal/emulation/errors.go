package emulation

import (
	"errors"
	"fmt"
)

// ErrSyntax is matched (errors.Is) by every *SyntaxError.
var ErrSyntax = errors.New("bad latency emulation spec")

// SyntaxError is a spec that Parse cannot read: which item, why, and what
// to write instead. A plain value.
type SyntaxError struct {
	// Spec is the whole text given to Parse.
	Spec string
	// Item is the comma-separated item at fault, e.g. "cxl=200".
	Item string
	// Reason says what is wrong with it.
	Reason string
	// Instead is what to write instead, e.g. "cxl=200ns".
	Instead string
}

// Error says what failed, with which value, and what to write instead.
func (e *SyntaxError) Error() string {
	s := fmt.Sprintf("latency emulation %q: %s", e.Spec, e.Reason)
	if e.Item != "" && e.Item != e.Spec {
		s = fmt.Sprintf("latency emulation %q: item %q: %s", e.Spec, e.Item, e.Reason)
	}
	if e.Instead != "" {
		s += fmt.Sprintf("; write %s", e.Instead)
	}
	return s
}

// Is reports ErrSyntax.
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }
