//go:build !(linux && cgo && verbs)

package verbs

import (
	"context"

	"github.com/farmem/farmem/rdma"
)

// errNotBuilt explains what is missing and what to do.
var errNotBuilt = &rdma.NotSupportedError{
	Feature: "verbs transport",
	Reason:  "this binary was built without libibverbs support; rebuild with CGO_ENABLED=1 -tags verbs on Linux with libibverbs-dev installed, or use the tcp transport",
}

// Transport is the verbs transport. In this build it only reports that verbs
// is not supported. It is stateless and safe for concurrent use.
type Transport struct{}

var _ rdma.Transport = Transport{}

// Name returns "verbs".
func (Transport) Name() string { return "verbs" }

// Dial always fails with an error matching rdma.ErrNotSupported in this build.
func (Transport) Dial(context.Context, string, []byte) (rdma.Conn, error) {
	return nil, errNotBuilt
}

// Dial always fails with an error matching rdma.ErrNotSupported in this build.
func Dial(ctx context.Context, addr string, cred []byte) (rdma.Conn, error) {
	return Transport{}.Dial(ctx, addr, cred)
}

// NewServer always fails with an error matching rdma.ErrNotSupported in this
// build; device names the RDMA device (e.g. "mlx5_0").
func NewServer(device string) (rdma.Exporter, error) {
	return nil, errNotBuilt
}
