package cxl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	kib = 1024
	mib = 1024 * kib
)

// Resolved device paths shared by the devdax and numa fixtures.
const (
	pathRoot0   = "devices/platform/ACPI0017:00/root0"
	pathRegion0 = pathRoot0 + "/decoder0.0/region0"
	pathDax00   = pathRegion0 + "/dax_region0/dax0.0"
	pathMem0    = "devices/pci0000:0c/0000:0c:00.0/0000:0d:00.0/mem0"
)

// fixtureCXL is the CXL part both CXL fixtures share: one memdev of size
// bytes behind one host bridge, one ram region, decoders at every level.
func fixtureCXL(size uint64, serial uint64, numa int) ([]Memdev, []Decoder, []Region) {
	memdevs := []Memdev{{
		Name: "mem0", Path: pathMem0, Host: "0000:0d:00.0", Endpoint: "endpoint2",
		RAMSize: size, Serial: serial, NumaNode: numa, FirmwareVersion: "BWFW VERSION 00",
	}}
	decoders := []Decoder{
		{
			Name: "decoder0.0", Path: pathRoot0 + "/decoder0.0", Kind: DecoderRoot, Port: "root0",
			Start: 0x290000000, Size: 0x100000000, TargetType: "expander",
			InterleaveWays: 1, InterleaveGranularity: 256,
		},
		{
			Name: "decoder1.0", Path: pathRoot0 + "/port1/decoder1.0", Kind: DecoderSwitch, Port: "port1",
			Start: 0x290000000, Size: size, TargetType: "expander",
			InterleaveWays: 1, InterleaveGranularity: 256, Region: "region0",
		},
		{
			Name: "decoder2.0", Path: pathRoot0 + "/port1/endpoint2/decoder2.0", Kind: DecoderEndpoint, Port: "endpoint2",
			Start: 0x290000000, Size: size, Mode: ModeRAM, TargetType: "expander",
			InterleaveWays: 1, InterleaveGranularity: 256, DPAResource: 0, DPASize: size,
			Memdev: "mem0", Region: "region0",
		},
		{
			Name: "decoder2.1", Path: pathRoot0 + "/port1/endpoint2/decoder2.1", Kind: DecoderEndpoint, Port: "endpoint2",
			Mode: ModeNone, TargetType: "expander", InterleaveWays: 1, InterleaveGranularity: 256,
			DPAResource: 1<<64 - 1, Memdev: "mem0",
		},
	}
	regions := []Region{{
		Name: "region0", Path: pathRegion0, RootDecoder: "decoder0.0", Mode: ModeRAM,
		Size: size, Resource: 0x290000000, InterleaveWays: 1, InterleaveGranularity: 256,
		Committed: true,
		Targets:   []RegionTarget{{Position: 0, Decoder: "decoder2.0", Memdev: "mem0"}},
		Dax:       []string{"dax0.0"},
	}}
	return memdevs, decoders, regions
}

func TestDiscoverFixtures(t *testing.T) {
	devdaxMem, devdaxDec, devdaxReg := fixtureCXL(256*mib, 0, 0)
	numaMem, numaDec, numaReg := fixtureCXL(512*mib, 2, -1)
	tests := []struct {
		name       string
		want       Inventory
		wantFar    []int
		wantDevdax []string
	}{
		{
			name: "devdax",
			want: Inventory{
				Memdevs: devdaxMem, Decoders: devdaxDec, Regions: devdaxReg,
				Dax: []DaxDevice{{
					Name: "dax0.0", Path: pathDax00, DevPath: "/dev/dax0.0",
					Size: 256 * mib, Align: 2 * mib, Resource: 0x290000000,
					NumaNode: 0, TargetNode: 1, Mode: DaxDevdax, Driver: "device_dax", Region: "region0",
				}},
				Nodes: []Node{{
					ID: 0, CPUs: []int{0, 1, 2, 3}, MemTotal: 8126464 * kib, MemFree: 7340032 * kib,
					Distance: []int{10}, MemoryTier: 4,
				}},
			},
			wantDevdax: []string{"dax0.0"},
		},
		{
			name: "numa",
			want: Inventory{
				Memdevs: numaMem, Decoders: numaDec, Regions: numaReg,
				Dax: []DaxDevice{{
					Name: "dax0.0", Path: pathDax00,
					Size: 512 * mib, Align: 2 * mib, Resource: 0x290000000,
					NumaNode: 0, TargetNode: 1, Mode: DaxSystemRAM, Driver: "kmem", Region: "region0",
				}},
				Nodes: []Node{
					{
						ID: 0, CPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}, MemTotal: 16252928 * kib, MemFree: 14680064 * kib,
						Distance: []int{10, 20}, MemoryTier: 4,
						HMAT: &HMAT{Initiators: []int{0}, ReadLatency: 80 * time.Nanosecond, WriteLatency: 80 * time.Nanosecond,
							ReadBandwidth: 51200, WriteBandwidth: 51200},
					},
					{
						ID: 1, MemTotal: 524288 * kib, MemFree: 520192 * kib,
						Distance: []int{20, 10}, MemoryTier: 36,
						HMAT: &HMAT{Initiators: []int{0}, ReadLatency: 230 * time.Nanosecond, WriteLatency: 250 * time.Nanosecond,
							ReadBandwidth: 25600, WriteBandwidth: 12800},
					},
				},
			},
			wantFar: []int{1},
		},
		{
			name: "plain",
			want: Inventory{
				Nodes: []Node{{
					ID: 0, CPUs: []int{0, 1}, MemTotal: 3892984 * kib, MemFree: 3432616 * kib,
					Distance: []int{10}, MemoryTier: 4,
				}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys, err := NewFS(filepath.Join("testdata", tt.name))
			require.NoError(t, err)
			inv, err := fsys.Discover()
			require.NoError(t, err)
			require.NoError(t, inv.Err())
			require.Equal(t, tt.want, *inv)

			require.Equal(t, tt.wantFar, farIDs(inv))
			var devdax []string
			for _, d := range inv.DevdaxDevices() {
				devdax = append(devdax, d.Name)
			}
			require.Equal(t, tt.wantDevdax, devdax)
		})
	}
}

func TestNodeFar(t *testing.T) {
	tests := []struct {
		name string
		node Node
		want bool
	}{
		{name: "cpu and memory", node: Node{CPUs: []int{0}, MemTotal: 1}, want: false},
		{name: "memory only", node: Node{MemTotal: 1}, want: true},
		{name: "cpu only", node: Node{CPUs: []int{0}}, want: false},
		{name: "empty", node: Node{}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.node.Far())
		})
	}
}

func TestNewFSRoot(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))

	for name, root := range map[string]string{
		"missing":  filepath.Join(dir, "nope"),
		"not dir":  file,
		"dangling": mustSymlink(t, filepath.Join(dir, "nope"), filepath.Join(dir, "link")),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewFS(root)
			require.ErrorIs(t, err, ErrNoSysfs)
			require.Contains(t, err.Error(), root)
		})
	}

	t.Run("default", func(t *testing.T) {
		fsys, err := NewFS("")
		if err != nil {
			require.ErrorIs(t, err, ErrNoSysfs)
			t.Skip("no /sys on this machine")
		}
		require.Equal(t, DefaultRoot, fsys.Root())
	})

	t.Run("root removed after NewFS", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "sys")
		require.NoError(t, os.Mkdir(root, 0o755))
		fsys, err := NewFS(root)
		require.NoError(t, err)
		require.NoError(t, os.Remove(root))
		inv, err := fsys.Discover()
		require.ErrorIs(t, err, ErrNoSysfs)
		require.Nil(t, inv)
	})

	t.Run("zero FS", func(t *testing.T) {
		_, err := FS{}.Discover()
		require.ErrorIs(t, err, ErrNoSysfs)
	})

	t.Run("empty root", func(t *testing.T) {
		fsys, err := NewFS(t.TempDir())
		require.NoError(t, err)
		inv, err := fsys.Discover()
		require.NoError(t, err)
		require.Equal(t, Inventory{}, *inv)
	})
}

func mustSymlink(t *testing.T, target, link string) string {
	t.Helper()
	require.NoError(t, os.Symlink(target, link))
	return link
}

// copyTree copies fixture src to a fresh directory, keeping symlinks as
// symlinks, and returns the copy's root.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "sys")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, 0o644)
		}
	})
	require.NoError(t, err)
	return dst
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, rel)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
}

func TestDiscoverBrokenTree(t *testing.T) {
	const (
		mem0   = "bus/cxl/devices/mem0/"
		node0  = "devices/system/node/node0/"
		node1  = "devices/system/node/node1/"
		dax00  = "bus/dax/devices/dax0.0/"
		reg0   = "bus/cxl/devices/region0/"
		tier36 = "devices/virtual/memory_tiering/memory_tier36/"
	)
	tests := []struct {
		name    string
		fixture string
		mutate  func(t *testing.T, root string)
		path    string // problem path relative to the root
		want    error  // sentinel it must match
		check   func(t *testing.T, inv *Inventory)
	}{
		{
			name: "missing region size", fixture: "devdax", path: reg0 + "size", want: ErrMissing,
			mutate: func(t *testing.T, root string) { require.NoError(t, os.Remove(filepath.Join(root, reg0, "size"))) },
			check: func(t *testing.T, inv *Inventory) {
				require.Len(t, inv.Regions, 1)
				require.Zero(t, inv.Regions[0].Size)
				require.Equal(t, []string{"dax0.0"}, inv.Regions[0].Dax, "the rest of the region still reads")
			},
		},
		{
			name: "garbage ram size", fixture: "devdax", path: mem0 + "ram/size", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, mem0+"ram/size", "0x10000000 bytes\n") },
			check: func(t *testing.T, inv *Inventory) {
				require.Len(t, inv.Memdevs, 1)
				require.Zero(t, inv.Memdevs[0].RAMSize)
				require.Equal(t, "BWFW VERSION 00", inv.Memdevs[0].FirmwareVersion, "the rest of the memdev still reads")
			},
		},
		{
			name: "garbage region size", fixture: "devdax", path: reg0 + "size", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, reg0+"size", "zz\n") },
			check: func(t *testing.T, inv *Inventory) {
				require.Len(t, inv.Regions, 1)
				require.Zero(t, inv.Regions[0].Size)
				require.Equal(t, uint64(0x290000000), inv.Regions[0].Resource)
			},
		},
		{
			name: "dangling memdev link", fixture: "devdax", path: "bus/cxl/devices/mem1", want: ErrDanglingLink,
			mutate: func(t *testing.T, root string) {
				mustSymlink(t, "../../../devices/pci0000:0c/0000:0c:01.0/0000:0e:00.0/mem1", filepath.Join(root, "bus/cxl/devices/mem1"))
			},
			check: func(t *testing.T, inv *Inventory) {
				require.Len(t, inv.Memdevs, 1, "mem0 still found, mem1 skipped")
				require.Equal(t, "mem0", inv.Memdevs[0].Name)
			},
		},
		{
			name: "dangling dax link", fixture: "devdax", path: "bus/dax/devices/dax1.0", want: ErrDanglingLink,
			mutate: func(t *testing.T, root string) {
				mustSymlink(t, "../../../devices/platform/hmem.0/dax1.0", filepath.Join(root, "bus/dax/devices/dax1.0"))
			},
			check: func(t *testing.T, inv *Inventory) { require.Len(t, inv.Dax, 1) },
		},
		{
			name: "link leaves the root", fixture: "devdax", path: "bus/cxl/devices/region7", want: ErrOutsideRoot,
			mutate: func(t *testing.T, root string) {
				outside := t.TempDir()
				mustSymlink(t, outside, filepath.Join(root, "bus/cxl/devices/region7"))
			},
			check: func(t *testing.T, inv *Inventory) { require.Len(t, inv.Regions, 1) },
		},
		{
			name: "directory where a file belongs", fixture: "devdax", path: mem0 + "pmem/size", want: ErrUnreadable,
			mutate: func(t *testing.T, root string) {
				p := filepath.Join(root, mem0, "pmem/size")
				require.NoError(t, os.Remove(p))
				require.NoError(t, os.Mkdir(p, 0o755))
			},
		},
		{
			name: "unreadable bus directory", fixture: "devdax", path: "bus/dax/devices", want: ErrUnreadable,
			mutate: func(t *testing.T, root string) {
				p := filepath.Join(root, "bus/dax/devices")
				require.NoError(t, os.RemoveAll(p))
				write(t, root, "bus/dax/devices", "not a directory\n")
			},
			check: func(t *testing.T, inv *Inventory) {
				require.Empty(t, inv.Dax)
				require.Len(t, inv.Regions, 1)
				require.Empty(t, inv.Regions[0].Dax)
			},
		},
		{
			name: "backwards cpulist", fixture: "devdax", path: node0 + "cpulist", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, node0+"cpulist", "3-1\n") },
			check: func(t *testing.T, inv *Inventory) {
				require.Nil(t, inv.Nodes[0].CPUs)
				require.NotZero(t, inv.Nodes[0].MemTotal)
			},
		},
		{
			name: "missing cpulist", fixture: "plain", path: node0 + "cpulist", want: ErrMissing,
			mutate: func(t *testing.T, root string) { require.NoError(t, os.Remove(filepath.Join(root, node0, "cpulist"))) },
		},
		{
			name: "garbage meminfo", fixture: "numa", path: node1 + "meminfo", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, node1+"meminfo", "Node 1 MemTotal: lots kB\n") },
			check: func(t *testing.T, inv *Inventory) {
				require.Zero(t, inv.Nodes[1].MemTotal)
				require.Empty(t, inv.FarNodes(), "a node whose memory is unknown is not reported as far")
			},
		},
		{
			name: "meminfo of another node", fixture: "numa", path: node1 + "meminfo", want: ErrMalformed,
			mutate: func(t *testing.T, root string) {
				write(t, root, node1+"meminfo", "Node 0 MemTotal: 1 kB\nNode 0 MemFree: 1 kB\n")
			},
		},
		{
			name: "meminfo without MemFree", fixture: "numa", path: node1 + "meminfo", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, node1+"meminfo", "Node 1 MemTotal: 1 kB\n") },
		},
		{
			name: "oversized meminfo", fixture: "numa", path: node1 + "meminfo", want: ErrMalformed,
			mutate: func(t *testing.T, root string) {
				write(t, root, node1+"meminfo", strings.Repeat("Node 1 MemTotal: 1 kB\n", 4000))
			},
		},
		{
			name: "garbage distance", fixture: "numa", path: node0 + "distance", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, node0+"distance", "10 far\n") },
		},
		{
			name: "garbage HMAT latency", fixture: "numa", path: node1 + "access0/initiators/read_latency", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, node1+"access0/initiators/read_latency", "fast\n") },
			check: func(t *testing.T, inv *Inventory) {
				h := inv.Nodes[1].HMAT
				require.NotNil(t, h)
				require.Zero(t, h.ReadLatency)
				require.Equal(t, 250*time.Nanosecond, h.WriteLatency)
			},
		},
		{
			name: "garbage tier nodelist", fixture: "numa", path: tier36 + "nodelist", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, tier36+"nodelist", "1-0\n") },
			check:  func(t *testing.T, inv *Inventory) { require.Equal(t, -1, inv.Nodes[1].MemoryTier) },
		},
		{
			name: "garbage numa_node", fixture: "numa", path: mem0 + "numa_node", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, mem0+"numa_node", "node0\n") },
			check:  func(t *testing.T, inv *Inventory) { require.Equal(t, -1, inv.Memdevs[0].NumaNode) },
		},
		{
			name: "empty dax align", fixture: "devdax", path: dax00 + "align", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, dax00+"align", "\n") },
		},
		{
			name: "region commit not boolean", fixture: "devdax", path: reg0 + "commit", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, reg0+"commit", "2\n") },
		},
		{
			name: "region target not a decoder", fixture: "devdax", path: reg0 + "target0", want: ErrMalformed,
			mutate: func(t *testing.T, root string) { write(t, root, reg0+"target0", "mem0\n") },
			check: func(t *testing.T, inv *Inventory) {
				require.Empty(t, inv.Regions[0].Targets)
				require.Equal(t, "region0", inv.Decoders[2].Region, "the range still ties decoder2.0 to region0")
			},
		},
		{
			name: "dangling attribute link", fixture: "devdax", path: mem0 + "serial", want: ErrDanglingLink,
			mutate: func(t *testing.T, root string) {
				p := filepath.Join(root, mem0, "serial")
				require.NoError(t, os.Remove(p))
				mustSymlink(t, "gone", p)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", tt.fixture))
			tt.mutate(t, root)
			fsys, err := NewFS(root)
			require.NoError(t, err)
			inv, err := fsys.Discover()
			require.NoError(t, err, "a broken file never fails Discover")
			require.Len(t, inv.Problems, 1, "exactly one problem: %v", inv.Problems)
			var ae *AttrError
			require.ErrorAs(t, inv.Problems[0], &ae)
			require.ErrorIs(t, ae, tt.want)
			require.Equal(t, filepath.Join(root, tt.path), ae.Path)
			require.Contains(t, ae.Error(), ae.Path)
			require.ErrorIs(t, inv.Err(), tt.want)
			if tt.check != nil {
				tt.check(t, inv)
			}
		})
	}
}

// TestDiscoverToleratesOptionalAndExtra checks that what a newer or older
// kernel legitimately adds or leaves out is not reported as a problem.
func TestDiscoverToleratesOptionalAndExtra(t *testing.T) {
	root := copyTree(t, filepath.Join("testdata", "numa"))
	for _, rel := range []string{
		"bus/cxl/devices/mem0/pmem",             // hidden empty partition
		"bus/cxl/devices/mem0/firmware_version", // optional
		"bus/cxl/devices/region0/mode",          // before 6.3
		"bus/dax/devices/dax0.0/align",          // before 5.10
		"bus/dax/devices/dax0.0/target_node",
		"devices/system/node/node1/access0", // no HMAT for this node
		"devices/virtual/memory_tiering",    // no memory tiering
	} {
		require.NoError(t, os.RemoveAll(filepath.Join(root, rel)))
	}
	write(t, root, "bus/cxl/devices/mem0/ram/qos_class", "42\n")
	write(t, root, "bus/cxl/devices/region0/access0/read_latency", "230\n")
	write(t, root, "bus/cxl/devices/mem0/cdat_extra", "\xff\xfe\n")
	write(t, root, "devices/system/node/node1/memory_side_cache/index1/size", "0x40000000\n")
	write(t, root, "devices/system/node/has_generic_initiator", "\n")
	require.NoError(t, os.Mkdir(filepath.Join(root, "bus/cxl/devices/nvdimm-bridge0"), 0o755))

	fsys, err := NewFS(root)
	require.NoError(t, err)
	inv, err := fsys.Discover()
	require.NoError(t, err)
	require.Empty(t, inv.Problems)
	require.Equal(t, uint64(512*mib), inv.Memdevs[0].RAMSize)
	require.Zero(t, inv.Memdevs[0].PMEMSize)
	require.Equal(t, ModeRAM, inv.Regions[0].Mode, "mode taken from the endpoint decoder")
	require.Equal(t, 0, inv.Dax[0].TargetNode, "falls back to numa_node")
	require.Nil(t, inv.Nodes[1].HMAT)
	require.Equal(t, -1, inv.Nodes[1].MemoryTier)
	require.Equal(t, []int{1}, farIDs(inv))
}

func farIDs(inv *Inventory) []int {
	var ids []int
	for _, n := range inv.FarNodes() {
		ids = append(ids, n.ID)
	}
	return ids
}

// TestDiscoverCorruptEveryFile overwrites each file of the CXL fixtures with
// garbage, and makes each symlink dangle, one at a time (restoring it after),
// so Discover must never panic or fail, whatever it reads.
func TestDiscoverCorruptEveryFile(t *testing.T) {
	garbage := []string{"\xff\x00garbage 0x-1,,3-1\n", "", strings.Repeat("9", 70000)}
	for _, fixture := range []string{"devdax", "numa"} {
		root := copyTree(t, filepath.Join("testdata", fixture))
		fsys, err := NewFS(root)
		require.NoError(t, err)
		var targets []string
		require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				targets = append(targets, p)
			}
			return err
		}))
		for i, p := range targets {
			rel, _ := filepath.Rel(root, p)
			t.Run(fixture+"/"+rel, func(t *testing.T) {
				fi, err := os.Lstat(p)
				require.NoError(t, err)
				if fi.Mode()&fs.ModeSymlink != 0 {
					target, err := os.Readlink(p)
					require.NoError(t, err)
					require.NoError(t, os.Remove(p))
					mustSymlink(t, "nowhere", p)
					t.Cleanup(func() {
						require.NoError(t, os.Remove(p))
						mustSymlink(t, target, p)
					})
				} else {
					orig, err := os.ReadFile(p)
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(p, []byte(garbage[i%len(garbage)]), 0o644))
					t.Cleanup(func() { require.NoError(t, os.WriteFile(p, orig, 0o644)) })
				}
				inv, err := fsys.Discover()
				require.NoError(t, err)
				for _, pr := range inv.Problems {
					var ae *AttrError
					require.True(t, errors.As(pr, &ae), "problem %v is an *AttrError", pr)
					require.True(t, strings.HasPrefix(ae.Path, root), "problem %v names a path in the tree", pr)
				}
			})
		}
		// Every corruption was undone: the tree reads clean again.
		inv, err := fsys.Discover()
		require.NoError(t, err)
		require.Empty(t, inv.Problems)
	}
}

// TestDiscoverLiveSysfs runs Discover on this machine's /sys: it must not
// fail or panic. What it finds depends on the machine, so it is only logged.
func TestDiscoverLiveSysfs(t *testing.T) {
	if _, err := os.Stat("/sys/devices"); err != nil {
		t.Skip("no sysfs mounted at /sys on this machine")
	}
	fsys, err := NewFS("")
	require.NoError(t, err)
	inv, err := fsys.Discover()
	require.NoError(t, err)
	t.Logf("live /sys: %d memdevs, %d regions, %d decoders, %d dax, %d nodes (%d far), %d problems",
		len(inv.Memdevs), len(inv.Regions), len(inv.Decoders), len(inv.Dax), len(inv.Nodes), len(inv.FarNodes()), len(inv.Problems))
	for _, p := range inv.Problems {
		t.Logf("problem: %v", p)
	}
}

func TestDiscoverFIFONeverBlocks(t *testing.T) {
	root := copyTree(t, filepath.Join("testdata", "plain"))
	p := filepath.Join(root, "devices/system/node/node0/cpulist")
	require.NoError(t, os.Remove(p))
	if err := mkfifo(p); err != nil {
		t.Skipf("cannot make a FIFO here: %v", err)
	}
	fsys, err := NewFS(root)
	require.NoError(t, err)
	inv, err := fsys.Discover()
	require.NoError(t, err)
	require.Len(t, inv.Problems, 1)
	require.ErrorIs(t, inv.Problems[0], ErrUnreadable)
}

// TestDaxPersistent: a dax device is persistent memory in a pmem CXL
// region or below libnvdimm (a plain NVDIMM namespace has no CXL region),
// and volatile in a ram region or elsewhere (hmem).
func TestDaxPersistent(t *testing.T) {
	inv := &Inventory{
		Regions: []Region{{Name: "region0", Mode: ModeRAM}, {Name: "region1", Mode: ModePMEM}},
		Dax: []DaxDevice{
			{Name: "dax0.0", Path: "devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0", Region: "region0"},
			{Name: "dax1.0", Path: "devices/platform/ACPI0017:00/root0/nvdimm-bridge0/ndbus0/region1/dax1.0/dax1.0", Region: "region1"},
			{Name: "dax2.0", Path: "devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0012:00/ndbus1/region2/dax2.0/dax2.0"},
			{Name: "dax3.0", Path: "devices/platform/hmem.0/dax3.0"},
		},
	}
	link(inv)
	got := map[string]bool{}
	for _, d := range inv.Dax {
		got[d.Name] = d.Persistent
	}
	require.Equal(t, map[string]bool{"dax0.0": false, "dax1.0": true, "dax2.0": true, "dax3.0": false}, got)
}
