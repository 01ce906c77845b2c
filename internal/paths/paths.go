package paths

import (
	"fmt"
	"os"
	"path/filepath"
)

// SocketEnv overrides the default socket for every client and the daemon.
const SocketEnv = "FARMEM_SOCKET"

// Socket is the default control socket: $FARMEM_SOCKET if set, else
// /run/farmem/poold.sock as root, else $XDG_RUNTIME_DIR/farmem/poold.sock,
// else a per-user directory under the temporary directory.
func Socket() string {
	if s := os.Getenv(SocketEnv); s != "" {
		return s
	}
	if os.Getuid() == 0 {
		return "/run/farmem/poold.sock"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "farmem", "poold.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("farmem-%d", os.Getuid()), "poold.sock")
}

// DataDir is the default state directory: /var/lib/farmem as root, else
// $XDG_STATE_HOME/farmem, else ~/.local/state/farmem.
func DataDir() string {
	if os.Getuid() == 0 {
		return "/var/lib/farmem"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "farmem")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "farmem")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("farmem-%d", os.Getuid()), "data")
}
