package devices

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Link layers and transports, as the kernel and this package name them.
const (
	// InfiniBand is a port whose link_layer is InfiniBand.
	InfiniBand = "InfiniBand"
	// RoCE is RDMA over Converged Ethernet: an Ethernet port of a CA
	// (mlx5 in Ethernet mode, rdma_rxe).
	RoCE = "RoCE"
	// IWARP is RDMA over TCP: a port of an RNIC (node_type 4).
	IWARP = "iWARP"
)

// Inventory is what one Discover call found. A plain value owned by the
// caller.
type Inventory struct {
	// Devices are the RDMA devices, class/infiniband/<dev>, by name.
	Devices []Device
	// Netdevs are the network interfaces, class/net/<if>, by name.
	Netdevs []Netdev
	// Problems lists the files that were missing or malformed; empty on a
	// healthy tree.
	Problems []error
}

// Device is one RDMA device. A plain value.
type Device struct {
	// Name is the kernel's name: mlx5_0, rxe0, cxgb4_0, siw_eth0.
	Name string
	// NodeType is the name part of node_type: CA (InfiniBand and RoCE
	// adapters, rdma_rxe) or RNIC (iWARP).
	NodeType string
	// Driver is the driver behind the device: the device/driver link
	// (mlx5_core, irdma, cxgb4, ...), or rdma_rxe / siw for the software
	// devices, which have no device link but a parent netdev.
	Driver string
	// Netdevs are the network interfaces of the device: its parent for a
	// software device, else device/net/*.
	Netdevs []string
	// Ports are the device's ports, by number.
	Ports []Port
}

// Port is one port of a device, ports/<n>. A plain value.
type Port struct {
	// Number is n.
	Number int
	// State is the logical state's name: DOWN, INIT, ARMED, ACTIVE,
	// ACTIVE_DEFER.
	State string
	// PhysState is the physical state's name: Sleep, Polling, Disabled,
	// LinkUp, LinkErrorRecovery, ...
	PhysState string
	// LinkLayer is InfiniBand or Ethernet, as the kernel writes it.
	LinkLayer string
	// Transport is InfiniBand, RoCE or iWARP: what the device reports,
	// from its node type and the port's link layer; "" when unknown.
	Transport string
	// Rate is the kernel's rate text, e.g. "100 Gb/sec (4X EDR)".
	Rate string
	// Netdev is the interface the port's first GID belongs to
	// (gid_attrs/ndevs/0; RoCE and iWARP), "" for InfiniBand.
	Netdev string
}

// Active reports whether the port can carry traffic.
func (p Port) Active() bool { return p.State == "ACTIVE" }

// NeedsRDMACM reports whether the port's queue pairs can be connected only
// through RDMA-CM: an iWARP port's connection is set up by the kernel's
// iw_cm (an MPA handshake over TCP), not by moving a queue pair to RTR with
// the peer's address as InfiniBand and RoCE allow. farmem's verbs backend
// connects queue pairs that second way and does not use RDMA-CM, so it
// cannot use such a port.
func (p Port) NeedsRDMACM() bool { return p.Transport == IWARP }

// Netdev is one network interface, class/net/<if>. A plain value.
type Netdev struct {
	// Name is the interface name, eth0.
	Name string
	// OperState is operstate: up, down, unknown, ...
	OperState string
	// Physical is true for an interface backed by a device (a NIC), as
	// opposed to loopback, bridges, veths and tunnels.
	Physical bool
	// Driver is the device's driver (virtio_net, mlx5_core, ...), "" for
	// a virtual interface.
	Driver string
}

// VerbsPorts returns the active ports that the verbs backend can use (not
// NeedsRDMACM) of every device, with their device.
func (inv *Inventory) VerbsPorts() (devs []Device, ports []Port) {
	for _, d := range inv.Devices {
		for _, p := range d.Ports {
			if p.Active() && !p.NeedsRDMACM() {
				devs, ports = append(devs, d), append(ports, p)
			}
		}
	}
	return devs, ports
}

// Discover reads the RDMA devices and network interfaces under root. Only
// an unusable root is an error (ErrNoSysfs); a missing class/infiniband
// means no RDMA device (or rdma drivers not loaded) and is not a problem.
func Discover(root string) (*Inventory, error) {
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w", root, ErrNoSysfs)
	}
	r := &reader{root: root}
	inv := &Inventory{}
	for _, name := range r.list("class/infiniband") {
		inv.Devices = append(inv.Devices, r.device(name))
	}
	for _, name := range r.list("class/net") {
		inv.Netdevs = append(inv.Netdevs, r.netdev(name))
	}
	inv.Problems = r.problems
	return inv, nil
}

type reader struct {
	root     string
	problems []error
}

func (r *reader) path(rel ...string) string {
	return filepath.Join(append([]string{r.root}, rel...)...)
}

// list returns the entries of a directory, sorted; none when it is missing.
func (r *reader) list(rel string) []string {
	es, err := os.ReadDir(r.path(rel))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.problems = append(r.problems, err)
		}
		return nil
	}
	var out []string
	for _, e := range es {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	slices.SortFunc(out, byNumber)
	return out
}

// byNumber sorts names with numbers in numeric order (port 2 before 10).
func byNumber(a, b string) int {
	na, ea := strconv.Atoi(a)
	nb, eb := strconv.Atoi(b)
	if ea == nil && eb == nil {
		return na - nb
	}
	return strings.Compare(a, b)
}

// read returns a file's trimmed text; a missing file is a problem only
// when required.
func (r *reader) read(rel string, required bool) string {
	b, err := os.ReadFile(r.path(rel))
	if err != nil {
		if required || !errors.Is(err, fs.ErrNotExist) {
			r.problems = append(r.problems, err)
		}
		return ""
	}
	return strings.TrimSpace(string(b))
}

// enum reads a "<n>: <name>" file and returns the name.
func (r *reader) enum(rel string) (int, string) {
	s := r.read(rel, true)
	if s == "" {
		return 0, ""
	}
	n, name, err := ParseEnum(s)
	if err != nil {
		r.problems = append(r.problems, fmt.Errorf("%s: %w", r.path(rel), err))
	}
	return n, name
}

// linkBase is the last element of a symlink's target, "" when absent.
func (r *reader) linkBase(rel string) string {
	t, err := os.Readlink(r.path(rel))
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// nodeRNIC is node_type's number for an iWARP RNIC.
const nodeRNIC = 4

func (r *reader) device(name string) Device {
	dir := "class/infiniband/" + name
	d := Device{Name: name}
	nodeType, nodeName := r.enum(dir + "/node_type")
	d.NodeType = nodeName
	parent := r.read(dir+"/parent", false)
	switch {
	case parent != "" && strings.HasPrefix(name, "siw"):
		d.Driver, d.Netdevs = "siw", []string{parent}
	case parent != "":
		d.Driver, d.Netdevs = "rdma_rxe", []string{parent}
	default:
		d.Driver = r.linkBase(dir + "/device/driver")
		d.Netdevs = r.list(dir + "/device/net")
	}
	for _, p := range r.list(dir + "/ports") {
		n, err := strconv.Atoi(p)
		if err != nil {
			continue
		}
		pd := dir + "/ports/" + p
		port := Port{Number: n, LinkLayer: r.read(pd+"/link_layer", true), Rate: r.read(pd+"/rate", false),
			Netdev: r.read(pd+"/gid_attrs/ndevs/0", false)}
		_, port.State = r.enum(pd + "/state")
		_, port.PhysState = r.enum(pd + "/phys_state")
		switch {
		case nodeType == nodeRNIC:
			port.Transport = IWARP
		case port.LinkLayer == "InfiniBand":
			port.Transport = InfiniBand
		case port.LinkLayer == "Ethernet":
			port.Transport = RoCE
		}
		d.Ports = append(d.Ports, port)
	}
	return d
}

func (r *reader) netdev(name string) Netdev {
	dir := "class/net/" + name
	n := Netdev{Name: name, OperState: r.read(dir+"/operstate", false)}
	if _, err := os.Lstat(r.path(dir, "device")); err == nil {
		n.Physical = true
		n.Driver = r.linkBase(dir + "/device/driver")
	}
	return n
}
