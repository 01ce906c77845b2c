package bench

import (
	"fmt"
	"io"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// serveEnv makes the test binary a server process for TestChildServers.
const serveEnv = "FARMEM_BENCH_TEST_SERVE"

func TestMain(m *testing.M) {
	if kind := os.Getenv(serveEnv); kind != "" {
		if err := Serve(kind, 64<<10, os.Stdout, func() { io.Copy(io.Discard, os.Stdin) }); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
