package devices

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDiscoverFixtures(t *testing.T) {
	for _, c := range []struct {
		tree      string
		devices   []Device
		physical  []string // physical interfaces, with their operstate
		operstate []string
	}{
		{tree: "roce-rxe", devices: []Device{{Name: "rxe0", NodeType: "CA", Driver: "rdma_rxe", Netdevs: []string{"eth0"},
			Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "Ethernet", Transport: RoCE, Rate: "10 Gb/sec (1X QDR)", Netdev: "eth0"}}}},
			physical: []string{"eth0"}, operstate: []string{"up"}},
		{tree: "ib-mlx5", devices: []Device{{Name: "mlx5_0", NodeType: "CA", Driver: "mlx5_core", Netdevs: []string{"ib0"},
			Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Transport: InfiniBand, Rate: "100 Gb/sec (4X EDR)"}}}},
			physical: []string{"eth0", "ib0"}, operstate: []string{"up", "up"}},
		{tree: "port-down", devices: []Device{{Name: "mlx5_0", NodeType: "CA", Driver: "mlx5_core", Netdevs: []string{"ens1f0np0"},
			Ports: []Port{{Number: 1, State: "DOWN", PhysState: "Disabled", LinkLayer: "Ethernet", Transport: RoCE, Rate: "100 Gb/sec (2X HDR)", Netdev: "ens1f0np0"}}}},
			physical: []string{"ens1f0np0"}, operstate: []string{"down"}},
		{tree: "iwarp", devices: []Device{{Name: "cxgb4_0", NodeType: "RNIC", Driver: "cxgb4", Netdevs: []string{"enp5s0f4"},
			Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "Ethernet", Transport: IWARP, Rate: "25 Gb/sec (1X EDR)", Netdev: "enp5s0f4"}}}},
			physical: []string{"enp5s0f4"}, operstate: []string{"up"}},
		{tree: "nic-only", physical: []string{"eth0"}, operstate: []string{"up"}},
	} {
		t.Run(c.tree, func(t *testing.T) {
			inv, err := Discover(filepath.Join("testdata", c.tree))
			require.NoError(t, err)
			require.Empty(t, inv.Problems)
			require.Equal(t, c.devices, inv.Devices)
			var phys, states []string
			for _, n := range inv.Netdevs {
				if n.Physical {
					phys, states = append(phys, n.Name), append(states, n.OperState)
					require.NotEmpty(t, n.Driver, n.Name)
				} else {
					require.Equal(t, "lo", n.Name)
				}
			}
			require.Equal(t, c.physical, phys)
			require.Equal(t, c.operstate, states)
			_, active := inv.VerbsPorts()
			want := 0
			for _, d := range c.devices {
				for _, p := range d.Ports {
					if p.Active() && !p.NeedsRDMACM() {
						want++
					}
				}
			}
			require.Len(t, active, want)
			if c.tree == "iwarp" {
				require.Empty(t, active, "an iWARP port needs RDMA-CM, which the verbs backend does not use")
			}
		})
	}
}

func TestDiscoverProblems(t *testing.T) {
	_, err := Discover(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, ErrNoSysfs)

	root := t.TempDir()
	port := filepath.Join(root, "class/infiniband/mlx5_0/ports/1")
	require.NoError(t, os.MkdirAll(port, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(port, "state"), []byte("ACTIVE\n"), 0o644))
	inv, err := Discover(root)
	require.NoError(t, err)
	require.Len(t, inv.Devices, 1)
	require.Empty(t, inv.Devices[0].Ports[0].State)
	// node_type, link_layer and phys_state are missing; state is malformed.
	require.Len(t, inv.Problems, 4)
	require.ErrorIs(t, errorsJoin(inv.Problems), ErrSyntax)
}

func TestParseEnum(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		name string
		bad  bool
	}{
		{in: "4: ACTIVE\n", n: 4, name: "ACTIVE"},
		{in: "5: LinkUp", n: 5, name: "LinkUp"},
		{in: "7: Phy Test", n: 7, name: "Phy Test"},
		{in: "1: CA", n: 1, name: "CA"},
		{in: "ACTIVE", bad: true},
		{in: "x: ACTIVE", bad: true},
		{in: "4:", bad: true},
		{in: "-1: DOWN", bad: true},
	} {
		t.Run(c.in, func(t *testing.T) {
			n, name, err := ParseEnum(c.in)
			if c.bad {
				require.ErrorIs(t, err, ErrSyntax)
				require.ErrorContains(t, err, "4: ACTIVE")
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.n, n)
			require.Equal(t, c.name, name)
		})
	}
}

func errorsJoin(errs []error) error { return errors.Join(errs...) }
