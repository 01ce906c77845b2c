// Package tier is farmem's one table of tier names: the canonical
// lower-case name of each tier (any, local, cxl, rdma) that records,
// listings, metrics and flags print, and the one parsing rule (any letter
// case) that the client library, poold's flags and configuration and
// memctl share. A name that is not a tier is an *UnknownError that lists
// the valid names and matches errs.ErrInvalid.
//
// Everything here is safe for concurrent use: the table is immutable.
//
// OS and tags: none.
package tier
