package chaos

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// TestRestartedApplication: an application process killed with SIGKILL
// and started again with the same client id (alloc.WithClientID) within
// the lease re-attaches to its unnamed segment with its bytes — also when
// poold was killed and restarted in between. Without coming back, the
// segment is reclaimed once the lease runs out.
func TestRestartedApplication(t *testing.T) {
	n := newNode(t, "--lease-ttl", "3s")
	n.start(t)
	env := func(id string) []string { return []string{sockEnv + "=" + n.sock, idEnv + "=" + id} }

	for _, tc := range []struct {
		name          string
		restartDaemon bool
	}{
		{"application restarts", false},
		{"application and poold restart", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "app-" + strconv.FormatBool(tc.restartDaemon)
			app := startRole(t, "create", env(id)...)
			seg := app.line(t, "ready ")
			app.kill9()
			if tc.restartDaemon {
				n.kill9(t)
				n.start(t)
			}
			again := startRole(t, "reattach", append(env(id), segEnv+"="+seg)...)
			require.Equal(t, seg, again.line(t, "intact "))
			require.NoError(t, again.cmd.Wait(), again.out.String())
		})
	}

	// An application that does not come back loses its segment to the lease.
	app := startRole(t, "create", env("app-gone")...)
	seg, err := strconv.ParseUint(app.line(t, "ready "), 10, 64)
	require.NoError(t, err)
	app.kill9()
	api := n.admin(t)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, err := api.Stat(ctx, &poolv1.StatRequest{Id: seg})
		cancel()
		if err != nil {
			break
		}
		require.False(t, time.Now().After(deadline), "segment %d outlived its owner's lease by a minute", seg)
		time.Sleep(100 * time.Millisecond)
	}
	st, err := n.state(t.Context(), api)
	require.NoError(t, err)
	require.Empty(t, st.segs)
	require.Equal(t, st.capacity, st.free)
}
