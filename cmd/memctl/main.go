package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/paths"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes memctl with args and returns the exit code; errors are one
// line on stderr.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext is run with a context that commands which run for long (bench)
// stop at.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "memctl: %v\n", err)
		return 1
	}
	return 0
}

// globals are the flags every command shares.
type globals struct {
	socket  string
	addr    string
	output  string
	timeout time.Duration
	out     io.Writer
	tls     certs.Files // --tls-cert, --tls-key, --tls-ca for --addr
}

func newRoot(stdout io.Writer) *cobra.Command {
	g := &globals{out: stdout}
	root := &cobra.Command{
		Use:           "memctl",
		Short:         "Administer a farmem pool daemon (poold)",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if g.output != "table" && g.output != "json" {
				return fmt.Errorf("-o %q: use table or json", g.output)
			}
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.socket, "socket", paths.Socket(), "poold's unix socket (FARMEM_SOCKET sets the default)")
	pf.StringVar(&g.addr, "addr", "", "a poold's TCP control address (its --listen) instead of the socket")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.StringVar(&g.tls.Cert, "tls-cert", "", "client certificate (PEM) for mutual TLS with --addr ('memctl certs init --clients NAME' makes one)")
	pf.StringVar(&g.tls.Key, "tls-key", "", "the private key of --tls-cert (PEM)")
	pf.StringVar(&g.tls.CA, "tls-ca", "", "CA certificate (PEM) the daemon's certificate must chain to")
	pf.DurationVar(&g.timeout, "timeout", 10*time.Second, "how long to wait for poold")
	root.AddCommand(newStatusCmd(g), newTiersCmd(g), newSegmentsCmd(g), newAllocCmd(g), newFreeCmd(g), newMoveCmd(g), newNodesCmd(g), newDrainCmd(g), newTopCmd(g), newBenchCmd(g), newBenchServeCmd(), newDoctorCmd(g), newCertsCmd(g), newKeyringCmd(g))
	addCompletions(root, g)
	return root
}

// target is where memctl reaches poold: --addr over TCP, else --socket,
// read as every client reads a target (a relative path is made absolute).
func (g *globals) target() (network, addr string, err error) {
	if g.addr != "" {
		return "tcp", g.addr, nil
	}
	network, addr, err = paths.ParseTarget(g.socket)
	if err == nil && network != "unix" {
		err = fmt.Errorf("--socket %q: give poold's unix socket path here, and a TCP address with --addr HOST:PORT", g.socket)
	}
	return network, addr, err
}

// call dials poold, runs fn with a deadline, and turns "nobody listens"
// into one line that says how to start the daemon, or, over TCP, what TLS
// setting keeps memctl out.
func (g *globals) call(fn func(context.Context, poolv1.PoolClient) error) error {
	return g.callWithin(g.timeout, fn)
}

// callWithin is call with a deadline d for the whole of fn; 0 sets none,
// for an fn that bounds each of its calls itself (a listing page by page).
func (g *globals) callWithin(d time.Duration, fn func(context.Context, poolv1.PoolClient) error) error {
	network, addr, err := g.target()
	if err != nil {
		return err
	}
	conn, err := g.channel(network, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	defer cancel()
	raw := fn(ctx, poolv1.NewPoolClient(conn))
	// An ErrUnavailable the daemon answered is its word about something
	// else (a far home away, a segment being moved): only a call it did
	// not answer means no poold is there.
	if err = errs.FromStatus(raw); errors.Is(err, errs.ErrUnavailable) && !errs.Answered(raw) {
		if network == "tcp" {
			return g.tcpUnavailable(addr)
		}
		return fmt.Errorf("no poold is listening at %s; start it with 'poold' (or point --socket / FARMEM_SOCKET at its socket)", addr)
	}
	return withCLIAdvice(err)
}

// tlsAdvice says, per TLS problem, which memctl flags to change.
var tlsAdvice = map[certs.Problem]string{
	certs.ServerWantsTLS:   "give --tls-cert, --tls-key and --tls-ca (a client certificate of poold's CA; 'memctl certs init --dir DIR --clients NAME' in the directory of poold's certificates makes one)",
	certs.ServerNotTLS:     "leave out --tls-cert, --tls-key and --tls-ca",
	certs.ServerUnverified: "--tls-ca must be the CA certificate that signed poold's --tls-cert, and --addr a name or IP its certificate is valid for",
	certs.ClientRefused:    "--tls-cert and --tls-key must be a client certificate signed by the CA poold's --tls-ca names ('memctl certs init --dir DIR --clients NAME' with that CA's directory makes one)",
}

// tcpUnavailable explains an unanswered call to --addr: a TLS mismatch
// when there is one, else that nothing answers there.
func (g *globals) tcpUnavailable(addr string) error {
	var client *tls.Config
	if !g.tls.IsZero() {
		var err error
		if client, err = g.tls.Client(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	var m *certs.Mismatch
	if err := certs.Diagnose(ctx, addr, client); errors.As(err, &m) {
		return fmt.Errorf("%w; %s", m, tlsAdvice[m.Problem])
	}
	return fmt.Errorf("no poold answers at %s; is its --listen address right?", addr)
}

// cliNoCapacity is what a person at the command line can do about
// ErrNoCapacity, in memctl's flags.
const cliNoCapacity = "no capacity: free segments ('memctl free'), ask for a smaller --size, or pick another --tier (see 'memctl tiers')"

// withCLIAdvice replaces the client library's advice in a capacity error
// (alloc.WithFallback) with memctl's; the error still matches its sentinel.
func withCLIAdvice(err error) error {
	if !errors.Is(err, errs.ErrNoCapacity) {
		return err
	}
	msg := err.Error()
	if lib := errs.ErrNoCapacity.Error(); strings.Contains(msg, lib) {
		msg = strings.Replace(msg, lib, cliNoCapacity, 1)
	}
	return &advisedError{msg: msg, err: err}
}

// advisedError is an error with its message rewritten for memctl's user.
type advisedError struct {
	msg string
	err error
}

func (e *advisedError) Error() string { return e.msg }

func (e *advisedError) Unwrap() error { return e.err }

// printJSON writes v indented.
func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
