package tier

import (
	"fmt"
	"strings"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// ErrUnknown is matched (errors.Is) by every *UnknownError, and matches
// errs.ErrInvalid.
var ErrUnknown = errs.Sub(errs.ErrInvalid, "unknown tier")

// UnknownError is a name that is not a tier: which name, and the names
// that are. A plain value, safe for concurrent use.
type UnknownError struct {
	// Name is the text given.
	Name string
	// Any says whether "any" was one of the valid names.
	Any bool
}

// Error names the text and the valid tiers.
func (e *UnknownError) Error() string {
	return fmt.Sprintf("unknown tier %q; use %s", e.Name, e.Valid())
}

// Valid lists the names that would have been accepted, for messages:
// "local, cxl, rdma or any", or "local, cxl or rdma".
func (e *UnknownError) Valid() string {
	var ns []string
	for _, t := range memory {
		ns = append(ns, Name(t))
	}
	if e.Any {
		ns = append(ns, Name(poolv1.Tier_TIER_UNSPECIFIED))
	}
	return strings.Join(ns[:len(ns)-1], ", ") + " or " + ns[len(ns)-1]
}

// Unwrap returns ErrUnknown, so errors.Is matches it and errs.ErrInvalid.
func (e *UnknownError) Unwrap() error { return ErrUnknown }
