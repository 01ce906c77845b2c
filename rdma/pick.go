package rdma

import (
	"context"
	"errors"
	"fmt"
)

// Pick dials addr with each candidate transport in order and returns the first
// connection that succeeds together with the transport that made it. A
// candidate whose Dial fails with ErrNotSupported (no RDMA device, built
// without the verbs tag) is skipped; any other error stops the search and is
// returned, because it means the transport works here but the peer refused or
// failed. Nil candidates are skipped.
func Pick(ctx context.Context, addr string, cred []byte, candidates ...Transport) (Conn, Transport, error) {
	var skipped []error
	for _, t := range candidates {
		if t == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		c, err := t.Dial(ctx, addr, cred)
		if err == nil {
			return c, t, nil
		}
		if errors.Is(err, ErrNotSupported) {
			skipped = append(skipped, fmt.Errorf("%s: %w", t.Name(), err))
			continue
		}
		return nil, nil, fmt.Errorf("rdma: dial %s with the %s transport: %w", addr, t.Name(), err)
	}
	if len(skipped) == 0 {
		return nil, nil, &NotSupportedError{Feature: "dial " + addr, Reason: "no transport given; pass at least the tcp transport"}
	}
	return nil, nil, fmt.Errorf("rdma: dial %s: no usable transport; add the tcp transport as the last candidate: %w", addr, errors.Join(skipped...))
}

// Dial is Pick without the chosen transport.
func Dial(ctx context.Context, addr string, cred []byte, candidates ...Transport) (Conn, error) {
	c, _, err := Pick(ctx, addr, cred, candidates...)
	return c, err
}
