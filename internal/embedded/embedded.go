package embedded

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	c, cfg, dir, err := prepare(ctx, out, socket, name, tune)
	if c != nil || err != nil {
		return c, func() {}, err
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
	return started(ctx, out, name, cfg, dir, "this process started one", stop)
}

// Daemon is the poold Spawn started in a child process, or none (PID 0)
// when a running poold answered. Not safe for concurrent use.
type Daemon struct {
	// PID is the child process's, 0 without one.
	PID int

	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	dir   string
}

// Stop ends the child daemon (its stdin closes: it closes the daemon and
// exits), waits for it, killing it after ten seconds, and removes its
// directories. A no-op without a child; call it after closing the client.
func (d *Daemon) Stop() {
	if d.PID == 0 {
		return
	}
	d.stdin.Close()
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
	os.RemoveAll(d.dir)
}

// childEnv carries, to a process Spawn starts, the configuration of the
// daemon it is to run (JSON); RunChild looks for it.
const childEnv = "FARMEM_EMBEDDED_POOLD"

// Spawn is Connect with the daemon it starts, when none answers, in a
// child process: this program's own executable, which runs the daemon
// when its main calls RunChild first. As a real poold, the daemon then
// has a Go scheduler of its own: in the program's process, a request to
// it waits, on a busy run queue, until the program's goroutines give way,
// and its CPU time is the program's. The child dies with the program (its
// stdin is the program's end of a pipe).
func Spawn(ctx context.Context, out io.Writer, socket, name string, tune func(*pool.Config)) (*alloc.Client, *Daemon, error) {
	c, cfg, dir, err := prepare(ctx, out, socket, name, tune)
	if c != nil || err != nil {
		return c, &Daemon{}, err
	}
	d, err := spawn(cfg, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("no poold was running, and starting one in a child process failed: %w", err)
	}
	c, _, err = started(ctx, out, name, cfg, dir, fmt.Sprintf("this program started one in its child process %d", d.PID), d.Stop)
	if err != nil {
		return nil, nil, err
	}
	return c, d, nil
}

// spawn starts this program's executable with cfg in childEnv and waits
// for its daemon to say it serves.
func spawn(cfg pool.Config, dir string) (*Daemon, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d := &Daemon{PID: cmd.Process.Pid, cmd: cmd, stdin: stdin, done: make(chan struct{}), dir: dir}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(l)
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(d.done)
	}()
	var got string
	select {
	case got = <-line:
	case <-time.After(time.Minute):
	}
	if got != readyLine {
		d.Stop()
		return nil, fmt.Errorf("%s: the child did not say it serves (%q): does main call embedded.RunChild first?", exe, got)
	}
	return d, nil
}

// readyLine is what a child writes on its stdout once its daemon serves.
const readyLine = "poold ready"

// RunChild returns at once unless this process is a child that Spawn
// started: then it runs the daemon until its stdin ends and exits. Call it
// first in main (and in TestMain of tests that Spawn).
func RunChild() {
	js, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	if err := serveChild(js, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "embedded poold: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serveChild runs the daemon js configures, writes readyLine to out once
// it serves, and closes it when in ends.
func serveChild(js string, in io.Reader, out io.Writer) error {
	var cfg pool.Config
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		return fmt.Errorf("the configuration in $%s: %w", childEnv, err)
	}
	d, err := pool.Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer d.Close()
	if _, err := fmt.Fprintln(out, readyLine); err != nil {
		return err
	}
	io.Copy(io.Discard, in)
	return nil
}

// prepare dials the poold at socket, returning its client when one
// answers; else the configuration of a daemon to start, tuned, in a new
// temporary directory dir.
func prepare(ctx context.Context, out io.Writer, socket, name string, tune func(*pool.Config)) (*alloc.Client, pool.Config, string, error) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	c, err := alloc.Dial(dctx, socket, alloc.WithClientName(name))
	cancel()
	if err == nil {
		fmt.Fprintf(out, "connected to the running poold %q\n", c.Node())
		return c, pool.Config{}, "", nil
	}
	if !errors.Is(err, alloc.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, pool.Config{}, "", err
	}
	// Shared memory if the host has it: the emulated device's files then
	// live in memory, as the daemon's own default puts them.
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "farmem-"+name)
	if err != nil {
		return nil, pool.Config{}, "", err
	}
	cfg := pool.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Socket = filepath.Join(dir, "poold.sock")
	cfg.ShmDir = filepath.Join(dir, "shm")
	cfg.EmulateCXL, cfg.LocalSize, cfg.ExportSize = 256*size.MiB, 256*size.MiB, 256*size.MiB
	if tune != nil {
		tune(&cfg)
	}
	return nil, cfg, dir, nil
}

// started says what was started (who) and dials it; stop undoes the start
// when the dial fails.
func started(ctx context.Context, out io.Writer, name string, cfg pool.Config, dir, who string, stop func()) (*alloc.Client, func(), error) {
	fmt.Fprintf(out, "no poold was running, so %s: emulated cxl %s, local %s, loopback rdma %s (socket %s, data in %s, removed at exit); run 'poold' to keep a pool running\n",
		who, cfg.EmulateCXL.Human(), cfg.LocalSize.Human(), cfg.ExportSize.Human(), cfg.Socket, dir)
	c, err := alloc.Dial(ctx, cfg.Socket, alloc.WithClientName(name))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return c, stop, nil
}
