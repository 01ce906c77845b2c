package cxl

import (
	"errors"
	"strconv"
	"strings"
)

var (
	// ErrNoSysfs reports that the sysfs root given to NewFS, or read by
	// Discover, is missing, not a directory, or unreadable. It is the only
	// error that makes Discover fail.
	ErrNoSysfs = errors.New("cxl: sysfs root is not usable")

	// ErrMissing reports that a file the kernel creates for every object of
	// its kind (a memdev's ram/size, a node's meminfo, ...) is absent.
	ErrMissing = errors.New("cxl: sysfs file is missing")

	// ErrMalformed reports a value the kernel never writes in that file: not
	// a number, a backwards range, an unknown unit, a wrong node number.
	ErrMalformed = errors.New("cxl: sysfs value is malformed")

	// ErrDanglingLink reports a symlink whose target does not exist, such as
	// /sys/bus/cxl/devices/mem1 pointing at a device directory that is gone
	// or was not copied into a fixture tree.
	ErrDanglingLink = errors.New("cxl: sysfs symlink is dangling")

	// ErrOutsideRoot reports a symlink that resolves outside the sysfs root,
	// typically an absolute link in a copied tree that points back into the
	// live /sys.
	ErrOutsideRoot = errors.New("cxl: sysfs symlink leaves the root")

	// ErrUnreadable reports a file or directory that exists but cannot be
	// read: permissions, an I/O error, a directory where a file belongs.
	ErrUnreadable = errors.New("cxl: sysfs file is unreadable")
)

// maxValueInError bounds how much of an offending value an AttrError keeps,
// so one garbage file cannot blow up a log line.
const maxValueInError = 64

// AttrError reports one sysfs file, symlink or parser input that could not be
// used. errors.Is(err, ErrMalformed) (or ErrMissing, ErrDanglingLink,
// ErrOutsideRoot, ErrUnreadable) tells the kind; errors.As gives the path.
//
// An AttrError is a plain value: safe for concurrent reads, not for
// concurrent mutation.
type AttrError struct {
	// Path is the file or link as opened, including the sysfs root; empty
	// when a Parse function was called directly.
	Path string
	// Value is the offending content or link target, trimmed and cut to 64
	// bytes; empty for a missing file.
	Value string
	// Reason says what is wrong with Value, for people.
	Reason string
	// Err is the sentinel: ErrMissing, ErrMalformed, ErrDanglingLink,
	// ErrOutsideRoot or ErrUnreadable.
	Err error
	// Cause is the underlying error (for example a *fs.PathError); may be nil.
	Cause error
}

// Error says what failed, with which value, and what to do about it.
func (e *AttrError) Error() string {
	var b strings.Builder
	b.WriteString("cxl: ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	var hint string
	switch e.Err {
	case ErrMissing:
		b.WriteString("missing")
		hint = "the kernel creates this file for every such object; if the tree is a copy, copy the whole device directory"
	case ErrMalformed:
		b.WriteString("malformed value " + strconv.Quote(e.Value))
		hint = "the kernel does not write this; if the tree is a copy, copy the file again"
	case ErrDanglingLink:
		b.WriteString("dangling link to " + strconv.Quote(e.Value))
		hint = "the target is gone; if the tree is a copy, copy the target directory too (cp -a keeps relative links)"
	case ErrOutsideRoot:
		b.WriteString("link to " + strconv.Quote(e.Value) + " leaves the sysfs root")
		hint = "recreate it as a relative link inside the tree"
	case ErrUnreadable:
		b.WriteString("unreadable")
		hint = "check permissions and that it is a regular file"
	default:
		if e.Err != nil {
			b.WriteString(e.Err.Error())
		}
	}
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	if e.Cause != nil {
		b.WriteString(" (")
		b.WriteString(e.Cause.Error())
		b.WriteString(")")
	}
	if hint != "" {
		b.WriteString("; ")
		b.WriteString(hint)
	}
	return b.String()
}

// Unwrap returns the sentinel and, when set, the underlying cause, so
// errors.Is matches both.
func (e *AttrError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

// malformed builds the parser error for value s.
func malformed(s, reason string) *AttrError {
	return &AttrError{Value: clip(s), Reason: reason, Err: ErrMalformed}
}

// clip trims s and cuts it to maxValueInError bytes.
func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxValueInError {
		return s[:maxValueInError] + "..."
	}
	return s
}
