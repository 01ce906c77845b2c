#!/bin/sh
# mkfixtures.sh rebuilds the sysfs trees of RDMA devices and network
# interfaces used by the tests (see README.md). Run it from this directory.
set -eu

# attr FILE VALUE writes one attribute, newline-terminated as the kernel
# writes them.
attr() { mkdir -p "$(dirname "$1")"; printf '%s\n' "$2" >"$1"; }
# lnk LINK TARGET makes LINK a relative symlink to TARGET (both under one tree).
lnk() {
	mkdir -p "$(dirname "$1")" "$2"
	ln -sfn "$(realpath -m --relative-to="$(dirname "$1")" "$2")" "$1"
}

# netdev TREE NAME DEVDIR BUS DRIVER OPERSTATE: a NIC's interface under its
# device DEVDIR (relative to devices/), bound to BUS's DRIVER.
netdev() {
	t=$1 dev=$t/devices/$3
	attr "$dev/net/$2/operstate" "$6"
	attr "$dev/net/$2/type" 1
	attr "$dev/net/$2/mtu" 1500
	lnk "$dev/net/$2/device" "$dev"
	lnk "$dev/driver" "$t/bus/$4/drivers/$5"
	lnk "$t/class/net/$2" "$dev/net/$2"
}

# loopback TREE: lo, a virtual interface with no device link.
loopback() {
	attr "$1/devices/virtual/net/lo/operstate" unknown
	attr "$1/devices/virtual/net/lo/type" 772
	lnk "$1/class/net/lo" "$1/devices/virtual/net/lo"
}

# port DIR N STATE PHYS LINKLAYER RATE [NDEV]: ports/N of a device.
port() {
	p=$1/ports/$2
	attr "$p/state" "$3"
	attr "$p/phys_state" "$4"
	attr "$p/link_layer" "$5"
	attr "$p/rate" "$6"
	attr "$p/lid" 0x0
	if [ $# -ge 7 ]; then
		attr "$p/gid_attrs/ndevs/0" "$7"
		attr "$p/gid_attrs/types/0" "RoCE v2"
	fi
}

# ibdev TREE NAME DIR NODETYPE: an RDMA device directory DIR (relative to
# devices/) linked from class/infiniband.
ibdev() {
	d=$1/devices/$3
	attr "$d/node_type" "$4"
	attr "$d/node_desc" "$(basename "$3")"
	attr "$d/fw_ver" 16.35.2000
	lnk "$1/class/infiniband/$2" "$d"
}

rm -rf roce-rxe ib-mlx5 port-down iwarp nic-only

# roce-rxe: a VM whose virtio NIC eth0 carries a Soft-RoCE device
# ('rdma link add rxe0 type rxe netdev eth0'): rdma_rxe's devices are
# virtual, with a parent attribute naming the netdev; port 1 ACTIVE.
loopback roce-rxe
netdev roce-rxe eth0 pci0000:00/0000:00:03.0/virtio0 virtio virtio_net up
ibdev roce-rxe rxe0 virtual/infiniband/rxe0 "1: CA"
attr roce-rxe/devices/virtual/infiniband/rxe0/parent eth0
port roce-rxe/devices/virtual/infiniband/rxe0 1 "4: ACTIVE" "5: LinkUp" Ethernet "10 Gb/sec (1X QDR)" eth0

# ib-mlx5: a ConnectX-5 in InfiniBand mode (mlx5_core) with its IPoIB
# interface ib0; port 1 ACTIVE at EDR. InfiniBand ports have no GID netdev.
loopback ib-mlx5
netdev ib-mlx5 eth0 pci0000:00/0000:00:03.0/virtio0 virtio virtio_net up
netdev ib-mlx5 ib0 pci0000:00/0000:00:02.0/0000:03:00.0 pci mlx5_core up
ibdev ib-mlx5 mlx5_0 pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0 "1: CA"
lnk ib-mlx5/devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0/device ib-mlx5/devices/pci0000:00/0000:00:02.0/0000:03:00.0
port ib-mlx5/devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0 1 "4: ACTIVE" "5: LinkUp" InfiniBand "100 Gb/sec (4X EDR)"

# port-down: a ConnectX-6 Dx in Ethernet mode (RoCE) whose interface
# ens1f0np0 is administratively down: port 1 DOWN, phys_state Disabled.
loopback port-down
netdev port-down ens1f0np0 pci0000:00/0000:00:02.0/0000:03:00.0 pci mlx5_core down
ibdev port-down mlx5_0 pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0 "1: CA"
lnk port-down/devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0/device port-down/devices/pci0000:00/0000:00:02.0/0000:03:00.0
port port-down/devices/pci0000:00/0000:00:02.0/0000:03:00.0/infiniband/mlx5_0 1 "1: DOWN" "3: Disabled" Ethernet "100 Gb/sec (2X HDR)" ens1f0np0

# iwarp: a Chelsio T6 (cxgb4, RDMA through iw_cxgb4): an RNIC, so iWARP
# whatever its Ethernet link layer; port 1 ACTIVE on enp5s0f4.
loopback iwarp
netdev iwarp enp5s0f4 pci0000:00/0000:00:02.0/0000:05:00.4 pci cxgb4 up
ibdev iwarp cxgb4_0 pci0000:00/0000:00:02.0/0000:05:00.4/infiniband/cxgb4_0 "4: RNIC"
lnk iwarp/devices/pci0000:00/0000:00:02.0/0000:05:00.4/infiniband/cxgb4_0/device iwarp/devices/pci0000:00/0000:00:02.0/0000:05:00.4
port iwarp/devices/pci0000:00/0000:00:02.0/0000:05:00.4/infiniband/cxgb4_0 1 "4: ACTIVE" "5: LinkUp" Ethernet "25 Gb/sec (1X EDR)" enp5s0f4

# nic-only: a VM with a virtio NIC and no RDMA device: rdma_rxe not loaded,
# so there is no class/infiniband at all.
loopback nic-only
netdev nic-only eth0 pci0000:00/0000:00:03.0/virtio0 virtio virtio_net up
