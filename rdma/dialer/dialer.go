package dialer

import (
	"context"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
	"github.com/farmem/farmem/rdma/tcp"
)

// Dial connects to the data plane at addr with the first transport that
// works here, in order of preference (verbs, then tcp), and returns the
// transport's name with the connection. A transport this host or build
// lacks is skipped (errors.Is(err, rdma.ErrNotSupported)). opts apply
// to the tcp transport.
func Dial(ctx context.Context, addr string, cred []byte, opts ...tcp.Option) (rdma.Conn, string, error) {
	conn, t, err := rdma.Pick(ctx, addr, cred, verbs.Transport{}, tcp.NewTransport(opts...))
	if err != nil {
		return nil, "", err
	}
	return conn, t.Name(), nil
}
