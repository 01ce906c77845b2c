package paths

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSocket(t *testing.T) {
	t.Setenv(SocketEnv, "/x/y.sock")
	require.Equal(t, "/x/y.sock", Socket(), "FARMEM_SOCKET wins")
	t.Setenv(SocketEnv, "")
	if os.Getuid() == 0 {
		require.Equal(t, "/run/farmem/poold.sock", Socket())
		require.Equal(t, "/var/lib/farmem", DataDir())
		return
	}
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	require.Equal(t, "/run/user/1000/farmem/poold.sock", Socket())
	t.Setenv("XDG_RUNTIME_DIR", "")
	require.True(t, strings.HasPrefix(Socket(), os.TempDir()))
	t.Setenv("XDG_STATE_HOME", "/state")
	require.Equal(t, filepath.Join("/state", "farmem"), DataDir())
}
