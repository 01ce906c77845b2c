package pool

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// TestReclaimToldOnKeepAlive: the segments a Welcome says were reclaimed
// count as told only once the client's first keep-alive shows that it took
// the Welcome in (a Welcome sent is only queued): a session that ends
// before that puts them back, and the next session's Welcome says them
// again.
func TestReclaimToldOnKeepAlive(t *testing.T) {
	cfg := testConfig(t)
	d := startNode(t, cfg)
	conn, err := grpc.NewClient("unix://"+cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)
	ident := fmt.Sprintf("uid:%d", os.Getuid())
	d.pool.mu.Lock()
	d.pool.reclaimed.add("app", ident, []uint64{41, 42}, d.pool.now())
	d.pool.mu.Unlock()
	ended := func() bool {
		d.pool.mu.Lock()
		defer d.pool.mu.Unlock()
		for _, st := range d.pool.sessions {
			if st.client.id == "app" {
				return false
			}
		}
		return true
	}
	welcome := func(keepAlive bool) []uint64 {
		ctx, cancel := context.WithCancel(t.Context())
		defer func() {
			cancel()
			require.Eventually(t, ended, 10*time.Second, 5*time.Millisecond, "the session ends at the daemon")
		}()
		st, err := api.Session(ctx)
		require.NoError(t, err)
		require.NoError(t, st.Send(&poolv1.SessionRequest{Msg: &poolv1.SessionRequest_Hello{Hello: &poolv1.Hello{ClientId: "app", ClientName: "test", Pid: 1}}}))
		resp, err := st.Recv()
		require.NoError(t, err)
		require.NotNil(t, resp.GetWelcome())
		if keepAlive {
			require.NoError(t, st.Send(&poolv1.SessionRequest{Msg: &poolv1.SessionRequest_KeepAlive{KeepAlive: &poolv1.KeepAlive{}}}))
			ack, err := st.Recv()
			require.NoError(t, err)
			require.NotNil(t, ack.GetAck())
		}
		return resp.GetWelcome().Reclaimed
	}
	require.Equal(t, []uint64{41, 42}, welcome(false))
	require.Equal(t, []uint64{41, 42}, welcome(true), "told again: the session ended before a keep-alive")
	require.Empty(t, welcome(false), "told: the client's keep-alive came")
}
