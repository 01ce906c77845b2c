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
//
// Atomics on a segment must be atomic with each other whichever transport
// carries them, and the home's CPU executes those of tcp peers: a verbs
// connection whose device's atomics are not atomic with the CPU's (not
// IBV_ATOMIC_GLOB) sends its atomics over a tcp connection of its own.
// Messages (Conn.Message, which the verbs control protocol lacks) go over
// that tcp connection too, dialed on the first message if the atomics did
// not need it.
func Dial(ctx context.Context, addr string, cred []byte, opts ...tcp.Option) (rdma.Conn, string, error) {
	tt := tcp.NewTransport(opts...)
	conn, t, err := rdma.Pick(ctx, addr, cred, verbs.Transport{}, tt)
	if err != nil {
		return nil, "", err
	}
	conn, err = split(ctx, conn, func(ctx context.Context) (rdma.Conn, error) { return tt.Dial(ctx, addr, cred) })
	if err != nil {
		return nil, "", err
	}
	return conn, t.Name(), nil
}
