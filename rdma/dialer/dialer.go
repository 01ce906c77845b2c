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
// lacks is skipped (errors.Is(err, rdma.ErrNotSupported)).
func Dial(ctx context.Context, addr string, cred []byte) (rdma.Conn, string, error) {
	conn, t, err := rdma.Pick(ctx, addr, cred, verbs.Transport{}, tcp.NewTransport())
	if err != nil {
		return nil, "", err
	}
	return conn, t.Name(), nil
}
