package errs

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// domain marks ErrorInfo details that carry a farmem sentinel.
const domain = "farmem.dev"

// table is the one mapping between sentinels and the wire: the gRPC code a
// generic client sees, and the reason farmem clients map back exactly. A
// sentinel made by Sub comes before its parent, which it also matches.
var table = []struct {
	err    error
	code   codes.Code
	reason string
}{
	{ErrOverBudget, codes.ResourceExhausted, "OVER_BUDGET"},
	{ErrNoCapacity, codes.ResourceExhausted, "NO_CAPACITY"},
	{ErrOutOfRange, codes.OutOfRange, "OUT_OF_RANGE"},
	{ErrNotFound, codes.NotFound, "NOT_FOUND"},
	{ErrAccessDenied, codes.PermissionDenied, "ACCESS_DENIED"},
	{ErrLeaseExpired, codes.FailedPrecondition, "LEASE_EXPIRED"},
	{ErrClosed, codes.Canceled, "CLOSED"},
	{ErrSegmentLost, codes.DataLoss, "SEGMENT_LOST"},
	{ErrInUse, codes.FailedPrecondition, "IN_USE"},
	{ErrInvalid, codes.InvalidArgument, "INVALID"},
	{ErrExists, codes.AlreadyExists, "EXISTS"},
	{ErrUnaligned, codes.InvalidArgument, "UNALIGNED"},
	{ErrUnavailable, codes.Unavailable, "UNAVAILABLE"},
	{ErrNotSupported, codes.Unimplemented, "NOT_SUPPORTED"},
	{ErrLimit, codes.ResourceExhausted, "LIMIT"},
}

// ToStatus converts a daemon-side error to a gRPC status error that carries
// its sentinel. The message keeps the full wrapped text for the person reading it.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isSentinel(err) {
		return err
	}
	for _, e := range table {
		if errors.Is(err, e.err) {
			st := status.New(e.code, err.Error())
			if d, derr := st.WithDetails(&errdetails.ErrorInfo{Domain: domain, Reason: e.reason}); derr == nil {
				st = d
			}
			return st.Err()
		}
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func isSentinel(err error) bool {
	for _, e := range table {
		if errors.Is(err, e.err) {
			return true
		}
	}
	return false
}

// FromStatus converts an error returned by a gRPC call into one that matches
// farmem's sentinels with errors.Is, keeping the daemon's message. Context
// errors are returned as they are; transport failures become ErrUnavailable.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.Domain != domain {
			continue
		}
		for _, e := range table {
			if e.reason == info.Reason {
				return &remoteError{msg: msg, sentinel: e.err}
			}
		}
	}
	switch st.Code() {
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	case codes.Unavailable:
		return &remoteError{msg: "pool unavailable: " + strings.TrimSpace(msg), sentinel: ErrUnavailable}
	}
	for _, e := range table {
		// A bare code names the general condition, never a Sub of it.
		if e.code == st.Code() && errors.Unwrap(e.err) == nil {
			return &remoteError{msg: msg, sentinel: e.err}
		}
	}
	return err
}

// Answered reports whether err, returned by a gRPC call, is a farmem
// daemon's answer (a status that carries one of the sentinels) rather
// than a failure to reach it, a deadline or a cancellation: the daemon
// decided it, so a refusal means the call did nothing.
func Answered(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Domain == domain {
			return true
		}
	}
	return false
}

// remoteError is an error the daemon returned: its text as the daemon wrote
// it, matching the sentinel it carried.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Is(target error) bool { return errors.Is(e.sentinel, target) }

// Retryable reports whether err is one a caller may retry after a backoff:
// the daemon was unreachable or restarting. An ErrIndeterminate is not:
// retrying it blindly could apply a write or atomic twice.
func Retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrIndeterminate)
}

// Reason names err's sentinel for protocols other than gRPC (descriptor
// passing); "" for nil, "INTERNAL" for an error without a sentinel.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	for _, e := range table {
		if errors.Is(err, e.err) {
			return e.reason
		}
	}
	return "INTERNAL"
}

// FromReason is the inverse of Reason: an error with message msg that
// matches the sentinel named by reason.
func FromReason(reason, msg string) error {
	for _, e := range table {
		if e.reason == reason {
			return &remoteError{msg: msg, sentinel: e.err}
		}
	}
	return errors.New(msg)
}
