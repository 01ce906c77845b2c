package main

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMetricsFlag runs poold with --metrics and --log-format json: /readyz
// answers 200 while it serves, /metrics has farmem families, and the log is
// JSON with the startup events.
func TestMetricsFlag(t *testing.T) {
	addr := freeAddr(t, "tcp")
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	d := startDaemon(t, data, sock, "--metrics", addr, "--log-format", "json")
	get := func(path string) (int, string) { return httpGet(addr, path) }
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	code, body := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "farmem_tier_capacity_bytes{")
	require.Contains(t, body, `farmem_build_info{`)
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code)

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.cmd.Wait(), "exit status 0 on SIGTERM: %s", d.log)
	msgs := map[string]map[string]any{}
	for line := range strings.Lines(d.log.String()) {
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &ev), "not a JSON log line: %q", line)
		msgs[ev["msg"].(string)] = ev
	}
	require.Equal(t, addr, msgs["metrics and health endpoints"]["addr"])
	require.Contains(t, msgs["poold serving"], "cxl")
	require.Contains(t, msgs, "shutting down")
}

// httpGet fetches http://addr/path: the status code and body, or 0 and
// the error.
func httpGet(addr, path string) (int, string) {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
