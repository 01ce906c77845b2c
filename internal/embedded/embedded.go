package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// Connect dials the poold at socket ("" for the default) as client name;
// when none answers within two seconds it starts one in this process,
// configured by tune (which may be nil), and tells out what it did. The
// returned stop closes the embedded daemon and removes its directories
// (a no-op when a running poold was used); call it after closing the client.
func Connect(ctx context.Context, out io.Writer, socket, name string, tune func(*pool.Config)) (*alloc.Client, func(), error) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c, err := alloc.Dial(dctx, socket, alloc.WithClientName(name))
	cancel()
	if err == nil {
		fmt.Fprintf(out, "connected to the running poold %q\n", c.Node())
		return c, func() {}, nil
	}
	if !errors.Is(err, alloc.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, nil, err
	}
	// Shared memory if the host has it: the emulated device's files then
	// live in memory, as the daemon's own default puts them.
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "farmem-"+name)
	if err != nil {
		return nil, nil, err
	}
	cfg := pool.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "poold.sock")
	cfg.ShmDir = filepath.Join(dir, "shm")
	cfg.EmulateCXL, cfg.LocalSize, cfg.ExportSize = 256*size.MiB, 256*size.MiB, 256*size.MiB
	if tune != nil {
		tune(&cfg)
	}
	d, err := pool.Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("no poold was running, and starting one in this process failed: %w", err)
	}
	stop := func() {
		d.Close()
		os.RemoveAll(dir)
	}
	fmt.Fprintf(out, "no poold was running, so this process started one: emulated cxl %s, local %s, loopback rdma %s (socket %s, data in %s, removed at exit); run 'poold' to keep a pool running\n",
		cfg.EmulateCXL.Human(), cfg.LocalSize.Human(), cfg.ExportSize.Human(), cfg.Socket, dir)
	c, err = alloc.Dial(ctx, cfg.Socket, alloc.WithClientName(name))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return c, stop, nil
}
