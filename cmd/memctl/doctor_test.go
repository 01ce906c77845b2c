package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/pooltest"
)

// sysfsTree merges fixture trees (relative to the module root) into one
// sysfs root, keeping their relative symlinks, and adds huge page counts
// when hugepages >= 0.
func sysfsTree(t *testing.T, hugepages int, trees ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, tree := range trees {
		src := filepath.Join("..", "..", tree)
		err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			dst := filepath.Join(root, rel)
			switch {
			case d.Type()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				return os.Symlink(target, dst)
			case d.IsDir():
				return os.MkdirAll(dst, 0o755)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(dst, b, 0o644)
		})
		require.NoError(t, err)
	}
	if hugepages >= 0 {
		dir := filepath.Join(root, "kernel/mm/hugepages/hugepages-2048kB")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		for _, f := range []string{"nr_hugepages", "free_hugepages"} {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(strconv.Itoa(hugepages)+"\n"), 0o644))
		}
	}
	return root
}

// fixes returns the commands of a report's problems, without the comments
// after them.
func fixes(r doctorReport) []string {
	out := []string{}
	for _, p := range r.Problems {
		cmd, _, _ := strings.Cut(p.Fix, "  #")
		out = append(out, strings.TrimSpace(cmd))
	}
	return out
}

func doctorJSON(t *testing.T, socket string, args ...string) doctorReport {
	t.Helper()
	out, stderr, code := memctl(t, socket, append([]string{"doctor", "-o", "json"}, args...)...)
	require.Zero(t, code, stderr)
	var r doctorReport
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	return r
}

// TestDoctorFixtures runs doctor, with no poold, on every CXL fixture tree
// combined with an RDMA fixture tree, and checks the problems it finds by
// the commands that fix them.
func TestDoctorFixtures(t *testing.T) {
	noPool := filepath.Join(t.TempDir(), "none.sock")
	for _, c := range []struct {
		name      string
		trees     []string
		hugepages int
		args      []string
		fixes     []string
		ports     []string // device/port transport state
		shown     []string // in the table
	}{
		{
			name: "devdax, NIC without rxe", trees: []string{"cxl/testdata/devdax", "rdma/devices/testdata/nic-only"}, hugepages: -1,
			fixes: []string{"modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0"},
			shown: []string{"dax0.0: devdax, 256.0 MiB", "eth0 (virtio_net): up"},
		},
		{
			name: "devdax meant as NUMA", trees: []string{"cxl/testdata/devdax", "rdma/devices/testdata/roce-rxe"}, hugepages: 512,
			args:  []string{"--dax-mode", "system-ram"},
			fixes: []string{"daxctl reconfigure-device --mode=system-ram dax0.0"},
			ports: []string{"rxe0/1 RoCE ACTIVE"},
			shown: []string{"rxe0 port 1: RoCE ACTIVE (LinkUp), driver rdma_rxe on eth0", "2048kB: 512 reserved"},
		},
		{
			name: "system-ram meant as devdax", trees: []string{"cxl/testdata/numa", "rdma/devices/testdata/roce-rxe"}, hugepages: 512,
			args:  []string{"--dax-mode", "devdax"},
			fixes: []string{"daxctl reconfigure-device --mode=devdax dax0.0"},
			ports: []string{"rxe0/1 RoCE ACTIVE"},
			shown: []string{"node1: memory only (far memory)", "memory_tier36, hmat read 230ns"},
		},
		{
			name: "CXL node in DRAM's tier", trees: []string{"cxl/testdata/numa-sametier", "rdma/devices/testdata/ib-mlx5"}, hugepages: 512,
			fixes: []string{"cat /sys/devices/virtual/memory_tiering/memory_tier4/nodelist"},
			ports: []string{"mlx5_0/1 InfiniBand ACTIVE"},
			shown: []string{"mlx5_0 port 1: InfiniBand ACTIVE (LinkUp), driver mlx5_core, 100 Gb/sec (4X EDR)"},
		},
		{
			name: "RDMA port down, no huge pages", trees: []string{"cxl/testdata/plain", "rdma/devices/testdata/port-down"}, hugepages: 0,
			fixes: []string{"sysctl -w vm.nr_hugepages=512", "ip link set ens1f0np0 up"},
			ports: []string{"mlx5_0/1 RoCE DOWN"},
		},
		// The trees the lab copies out of its QEMU guests (lab/run.sh
		// --update-fixtures): real kernels' sysfs, not hand-made.
		{
			name: "QEMU lab, CXL pmem as devdax (kernel 6.1)", trees: []string{"cxl/testdata/qemu-devdax", "rdma/devices/testdata/roce-rxe"}, hugepages: 512,
			fixes: []string{},
			ports: []string{"rxe0/1 RoCE ACTIVE"},
			shown: []string{"region0: pmem 256.0 MiB, 1-way, committed true, dax dax0.0", "dax0.0: devdax"},
		},
		{
			name: "QEMU lab, CXL pmem as system-ram (kernel 6.1)", trees: []string{"cxl/testdata/qemu-numa", "rdma/devices/testdata/roce-rxe"}, hugepages: 512,
			fixes: []string{},
			ports: []string{"rxe0/1 RoCE ACTIVE"},
			shown: []string{"dax0.0: system-ram", "node1: memory only (far memory)"},
		},
		{
			name: "QEMU lab, volatile CXL memory expander (kernel 6.12)", trees: []string{"cxl/testdata/qemu-ram", "rdma/devices/testdata/roce-rxe"}, hugepages: 512,
			fixes: []string{},
			ports: []string{"rxe0/1 RoCE ACTIVE"},
			shown: []string{"mem0: 256.0 MiB ram, 0 B pmem", "region0: ram 256.0 MiB, 1-way, committed true, dax dax0.0",
				"dax0.0: system-ram, 256.0 MiB, node 1, region0", "node1: memory only (far memory)", "memory_tier22"},
		},
		{
			name: "iWARP: not usable by the verbs backend", trees: []string{"cxl/testdata/plain", "rdma/devices/testdata/iwarp"}, hugepages: 64,
			fixes: []string{"nothing to do for the TCP fallback; for one-sided RDMA give the host a RoCE or InfiniBand device, or Soft-RoCE on its interface: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev enp5s0f4"},
			ports: []string{"cxgb4_0/1 iWARP ACTIVE"},
			shown: []string{"cxgb4_0/1 is iWARP, which poold's verbs backend cannot use: iWARP connects queue pairs through RDMA-CM"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := sysfsTree(t, c.hugepages, c.trees...)
			r := doctorJSON(t, noPool, append([]string{"--sysfs", root, "--shm-root", root}, c.args...)...)
			require.False(t, r.Pool.Reachable)
			require.Contains(t, strings.Join(r.Notes, "\n"), "poold did not answer")
			require.Equal(t, c.fixes, fixes(r))
			var ports []string
			for _, p := range r.RDMA {
				ports = append(ports, p.Device+"/"+strconv.Itoa(p.Port)+" "+p.Transport+" "+p.State)
			}
			require.Equal(t, c.ports, ports)

			out, stderr, code := memctl(t, noPool, append([]string{"doctor", "--sysfs", root, "--shm-root", root}, c.args...)...)
			require.Zero(t, code, stderr)
			for _, s := range c.shown {
				require.Contains(t, out, s)
			}
			for _, f := range c.fixes {
				require.Contains(t, out, "fix: "+f)
			}
		})
	}
}

// TestDoctorWithPool runs doctor against a running poold: it shows what
// poold uses and why its rdma tier runs over TCP, flags the unused far
// node, and notes an injected latency below the real cost.
func TestDoctorWithPool(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.MeasureTiers = true
	var err error
	cfg.EmulateLatency, err = emulation.Parse("rdma=2us")
	require.NoError(t, err)
	pooltest.Start(t, cfg)
	root := sysfsTree(t, 512, "cxl/testdata/numa", "rdma/devices/testdata/nic-only")

	var r doctorReport
	require.Eventually(t, func() bool {
		r = doctorJSON(t, cfg.Socket, "--sysfs", root, "--shm-root", root)
		return strings.Contains(strings.Join(r.Notes, "\n"), "emulation only adds latency")
	}, 30*time.Second, 100*time.Millisecond, "doctor never noted the injected latency below the measured one")
	require.True(t, r.Pool.Reachable)
	require.Equal(t, "tcp", r.Pool.Transport)
	require.Equal(t, "TCP fallback: no active RDMA port on this host", r.Pool.TransportReason)
	require.Len(t, r.Pool.TierLines, 3)
	require.Equal(t, []string{
		"systemctl restart poold && journalctl -u poold -n 50 | grep -i 'numa node'",
		"modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0",
	}, fixes(r))

	out, _, code := memctl(t, cfg.Socket, "doctor", "--sysfs", root, "--shm-root", root)
	require.Zero(t, code)
	require.Contains(t, out, "rdma transport  tcp: TCP fallback")
	require.Contains(t, out, "not used by poold")
	t.Log("\n" + out)

	_, stderr, code := memctl(t, cfg.Socket, "doctor", "--dax-mode", "fsdax")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "use devdax or system-ram")
}

// TestDoctorIWARPWithPool: on a host whose only RDMA port is iWARP, doctor
// says why poold's rdma tier runs over TCP (the verbs backend connects
// queue pairs without RDMA-CM, which iWARP needs) and does not tell the
// user to rebuild poold with verbs.
func TestDoctorIWARPWithPool(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	root := sysfsTree(t, 64, "cxl/testdata/plain", "rdma/devices/testdata/iwarp")
	r := doctorJSON(t, cfg.Socket, "--sysfs", root, "--shm-root", root)
	require.True(t, r.Pool.Reachable)
	require.Equal(t, "tcp", r.Pool.Transport)
	require.Equal(t, "TCP fallback: the active RDMA ports are iWARP, which the verbs backend cannot use (they need RDMA-CM)", r.Pool.TransportReason)
	for _, f := range fixes(r) {
		require.NotContains(t, f, "-tags verbs", "a verbs build cannot use iWARP")
	}
	require.Contains(t, strings.Join(fixes(r), "\n"), "RoCE or InfiniBand device")
}
