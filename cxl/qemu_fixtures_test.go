package cxl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestQEMUFixtures reads the sysfs trees that lab/run.sh copies out of its
// QEMU guests. The cxl guest (QEMU 7.2, kernel 6.1, one cxl-type3 device
// with 256 MiB of persistent memory behind a pxb-cxl host bridge, a pmem
// region, a devdax namespace) gives qemu-devdax, with dax0.0 in devdax
// mode, and qemu-numa, after `daxctl reconfigure-device --mode=system-ram`.
// The cxl-ram guest (QEMU 10, kernel 6.12, the same device with 256 MiB of
// volatile memory: a memory expander) gives qemu-ram: a ram region whose
// dax0.0 the kernel onlined as a memory-only node. The committed copies
// live in testdata/; FARMEM_CXL_FIXTURES points the test at a fresh run's
// trees instead (the lab does that to check them before they replace
// these).
func TestQEMUFixtures(t *testing.T) {
	dir := os.Getenv("FARMEM_CXL_FIXTURES")
	if dir == "" {
		dir = "testdata"
	}
	for _, tc := range []struct {
		name string
		mode MemMode // the memdev's capacity and the region's mode
		dax  DaxMode
		// onlined is the memory-only node's size; 0 in devdax mode. A
		// pmem namespace's info block offsets the devdax start, and memory
		// blocks are 128 MiB, so one block of its ~250 MiB comes online; a
		// ram region has no namespace and all of it does.
		onlined uint64
	}{
		{"qemu-devdax", ModePMEM, DaxDevdax, 0},
		{"qemu-numa", ModePMEM, DaxSystemRAM, 128 << 20},
		{"qemu-ram", ModeRAM, DaxSystemRAM, 256 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(dir, tc.name)
			if _, err := os.Stat(root); err != nil {
				t.Skipf("no tree %s (run lab/run.sh --update-fixtures): %v", root, err)
			}
			fs, err := NewFS(root)
			require.NoError(t, err)
			inv, err := fs.Discover()
			require.NoError(t, err)
			for _, p := range inv.Problems {
				t.Logf("problem: %v", p)
			}

			require.Len(t, inv.Memdevs, 1)
			mem := inv.Memdevs[0]
			require.Equal(t, "mem0", mem.Name)
			require.EqualValues(t, 256<<20, mem.RAMSize+mem.PMEMSize)
			if tc.mode == ModeRAM {
				require.Zero(t, mem.PMEMSize)
			} else {
				require.Zero(t, mem.RAMSize)
			}

			require.Len(t, inv.Regions, 1)
			reg := inv.Regions[0]
			require.Equal(t, "region0", reg.Name)
			require.Equal(t, tc.mode, reg.Mode)
			require.Equal(t, []string{"dax0.0"}, reg.Dax, "the region's dax device, below it (ram) or in its address range (pmem)")
			require.True(t, reg.Committed)
			require.EqualValues(t, 256<<20, reg.Size)
			require.Equal(t, "decoder0.0", reg.RootDecoder)
			require.Len(t, reg.Targets, 1)
			require.Equal(t, "mem0", reg.Targets[0].Memdev)

			var root0 *Decoder
			for i := range inv.Decoders {
				if inv.Decoders[i].Name == "decoder0.0" {
					root0 = &inv.Decoders[i]
				}
			}
			require.NotNil(t, root0, "root decoder decoder0.0 (the CXL fixed memory window)")
			require.EqualValues(t, 4<<30, root0.Size)

			require.Len(t, inv.Dax, 1)
			dx := inv.Dax[0]
			require.Equal(t, "dax0.0", dx.Name)
			require.EqualValues(t, 2<<20, dx.Align)
			require.NotZero(t, dx.Size)
			require.LessOrEqual(t, dx.Size, uint64(256<<20), "a pmem namespace's info block takes some of the region")
			require.Equal(t, "region0", dx.Region)
			require.NotZero(t, dx.TargetNode, "QEMU with maxmem gives the CXL window its own proximity domain")

			node := func(id int) *Node {
				for i := range inv.Nodes {
					if inv.Nodes[i].ID == id {
						return &inv.Nodes[i]
					}
				}
				return nil
			}
			require.NotNil(t, node(0))
			require.NotEmpty(t, node(0).CPUs)

			require.Equal(t, tc.dax, dx.Mode)
			require.Equal(t, tc.mode == ModePMEM, dx.Persistent, "a pmem region's device is persistent memory, a ram region's is not")
			if tc.mode == ModeRAM {
				require.EqualValues(t, 256<<20, dx.Size, "no namespace info block")
			}
			far := inv.FarNodes()
			if tc.dax == DaxDevdax {
				require.Equal(t, "device_dax", dx.Driver)
				require.Equal(t, "/dev/dax0.0", dx.DevPath)
				require.Len(t, inv.DevdaxDevices(), 1)
				require.Empty(t, far)
				return
			}
			require.Equal(t, "kmem", dx.Driver)
			require.Empty(t, inv.DevdaxDevices())
			require.Len(t, far, 1)
			require.Equal(t, dx.TargetNode, far[0].ID)
			require.Empty(t, far[0].CPUs)
			require.EqualValues(t, tc.onlined, far[0].MemTotal)
		})
	}
}
