#!/bin/sh
# mkfixtures.sh rebuilds the hand-made sysfs trees devdax/, numa/ and plain/
# (see README.md). Run it from this directory. Trees copied from real hosts
# sit beside these and are not touched.
set -eu

# attr FILE VALUE... writes one attribute, newline-terminated as the kernel
# writes them.
attr() { f=$1; shift; mkdir -p "$(dirname "$f")"; printf '%s\n' "$@" >"$f"; }
# lnk LINK TARGET makes LINK a relative symlink to TARGET (both under one tree).
lnk() {
	mkdir -p "$(dirname "$1")"
	ln -sfn "$(realpath -m --relative-to="$(dirname "$1")" "$2")" "$1"
}

# node TREE ID CPULIST DISTANCE MEMTOTAL_KB MEMFREE_KB CPUS
node() {
	n=$1/devices/system/node/node$2
	attr "$n/cpulist" "$3"
	attr "$n/distance" "$4"
	used=$(($5 - $6))
	cat >"$n/meminfo" <<EOM
Node $2 MemTotal:       $5 kB
Node $2 MemFree:        $6 kB
Node $2 MemUsed:        $used kB
Node $2 SwapCached:            0 kB
Node $2 Active:         $((used / 4)) kB
Node $2 Inactive:       $((used / 2)) kB
Node $2 Active(anon):   $((used / 16)) kB
Node $2 Inactive(anon): $((used / 8)) kB
Node $2 Dirty:                 0 kB
Node $2 FilePages:      $((used / 2)) kB
Node $2 AnonHugePages:         0 kB
Node $2 HugePages_Total:     0
Node $2 HugePages_Free:      0
Node $2 HugePages_Surp:      0
EOM
	attr "$1/bus/node/drivers_autoprobe" 1
	lnk "$n/subsystem" "$1/bus/node"
	for c in $7; do lnk "$n/cpu$c" "$1/devices/system/cpu/cpu$c"; attr "$1/devices/system/cpu/cpu$c/online" 1; done
}

tier() { attr "$1/devices/virtual/memory_tiering/memory_tier$2/nodelist" "$3"; }

# cxl TREE DAXDRIVER SIZEHEX SIZEDEC MEMNUMA SERIAL: one QEMU cxl-type3
# volatile device behind one pxb-cxl host bridge and one fixed memory window,
# with one ram region and its dax device bound to DAXDRIVER.
cxl() {
	t=$1 drv=$2 hex=$3 dec=$4
	cd0=$t/devices/platform/ACPI0017:00/root0
	pci=$t/devices/pci0000:0c
	mem=$pci/0000:0c:00.0/0000:0d:00.0/mem0
	port=$cd0/port1
	ep=$port/endpoint2
	reg=$cd0/decoder0.0/region0
	dax=$reg/dax_region0/dax0.0

	attr "$pci/0000:0c:00.0/0000:0d:00.0/vendor" 0x8086
	attr "$pci/0000:0c:00.0/0000:0d:00.0/class" 0x050210
	attr "$mem/devtype" cxl_memdev
	attr "$mem/dev" 251:0
	attr "$mem/firmware_version" "BWFW VERSION 00"
	attr "$mem/label_storage_size" 0x0
	attr "$mem/payload_max" 2048
	attr "$mem/numa_node" "$5"
	attr "$mem/serial" "$6"
	attr "$mem/ram/size" "$hex"
	attr "$mem/pmem/size" 0x0
	attr "$mem/security/state" disabled
	lnk "$mem/driver" "$t/bus/cxl/drivers/cxl_mem"
	lnk "$mem/subsystem" "$t/bus/cxl"

	attr "$cd0/devtype" cxl_port
	lnk "$cd0/uport" "$t/devices/platform/ACPI0017:00"
	attr "$t/devices/platform/ACPI0016:00/path" "\\_SB_.PC12"
	lnk "$cd0/dport12" "$t/devices/platform/ACPI0016:00"
	attr "$cd0/decoder0.0/devtype" cxl_decoder_root
	attr "$cd0/decoder0.0/start" 0x290000000
	attr "$cd0/decoder0.0/size" 0x100000000
	attr "$cd0/decoder0.0/interleave_ways" 1
	attr "$cd0/decoder0.0/interleave_granularity" 256
	attr "$cd0/decoder0.0/target_type" expander
	attr "$cd0/decoder0.0/target_list" 12
	attr "$cd0/decoder0.0/locked" 1
	attr "$cd0/decoder0.0/cap_pmem" 1
	attr "$cd0/decoder0.0/cap_ram" 1
	attr "$cd0/decoder0.0/cap_type2" 0
	attr "$cd0/decoder0.0/cap_type3" 1
	attr "$cd0/decoder0.0/create_pmem_region" region1
	attr "$cd0/decoder0.0/create_ram_region" region1

	attr "$port/devtype" cxl_port
	lnk "$port/uport" "$pci"
	lnk "$port/dport0" "$pci/0000:0c:00.0"
	attr "$port/decoders_committed" 1
	attr "$port/decoder1.0/devtype" cxl_decoder_switch
	attr "$port/decoder1.0/start" 0x290000000
	attr "$port/decoder1.0/size" "$hex"
	attr "$port/decoder1.0/interleave_ways" 1
	attr "$port/decoder1.0/interleave_granularity" 256
	attr "$port/decoder1.0/target_type" expander
	attr "$port/decoder1.0/target_list" 0
	attr "$port/decoder1.0/locked" 0

	attr "$ep/devtype" cxl_port
	lnk "$ep/uport" "$mem"
	lnk "$ep/parent_dport" "$pci/0000:0c:00.0"
	attr "$ep/decoders_committed" 1
	attr "$ep/decoder2.0/devtype" cxl_decoder_endpoint
	attr "$ep/decoder2.0/start" 0x290000000
	attr "$ep/decoder2.0/size" "$hex"
	attr "$ep/decoder2.0/mode" ram
	attr "$ep/decoder2.0/dpa_resource" 0x0
	attr "$ep/decoder2.0/dpa_size" "$hex"
	attr "$ep/decoder2.0/interleave_ways" 1
	attr "$ep/decoder2.0/interleave_granularity" 256
	attr "$ep/decoder2.0/target_type" expander
	attr "$ep/decoder2.0/locked" 0
	attr "$ep/decoder2.1/devtype" cxl_decoder_endpoint
	attr "$ep/decoder2.1/start" 0x0
	attr "$ep/decoder2.1/size" 0x0
	attr "$ep/decoder2.1/mode" none
	attr "$ep/decoder2.1/dpa_resource" 0xffffffffffffffff
	attr "$ep/decoder2.1/dpa_size" 0x0
	attr "$ep/decoder2.1/interleave_ways" 1
	attr "$ep/decoder2.1/interleave_granularity" 256
	attr "$ep/decoder2.1/target_type" expander
	attr "$ep/decoder2.1/locked" 0

	attr "$reg/devtype" cxl_region
	attr "$reg/uuid" ""
	attr "$reg/commit" 1
	attr "$reg/mode" ram
	attr "$reg/size" "$hex"
	attr "$reg/resource" 0x290000000
	attr "$reg/interleave_ways" 1
	attr "$reg/interleave_granularity" 256
	attr "$reg/target0" decoder2.0
	lnk "$reg/driver" "$t/bus/cxl/drivers/cxl_region"

	attr "$reg/dax_region0/devtype" cxl_dax_region
	attr "$reg/dax_region0/dax_region/id" 0
	attr "$reg/dax_region0/dax_region/size" "$dec"
	attr "$reg/dax_region0/dax_region/align" 2097152
	attr "$reg/dax_region0/dax_region/available_size" 0
	attr "$dax/size" "$dec"
	attr "$dax/align" 2097152
	attr "$dax/resource" 0x290000000
	attr "$dax/numa_node" 0
	attr "$dax/target_node" 1
	attr "$dax/memmap_on_memory" 0
	attr "$dax/mapping0/start" 0x290000000
	attr "$dax/mapping0/end" "$(printf '0x%x' $((0x290000000 + dec - 1)))"
	attr "$dax/mapping0/page_offset" 0x0
	lnk "$dax/driver" "$t/bus/dax/drivers/$drv"
	lnk "$dax/subsystem" "$t/bus/dax"

	for d in cxl_mem cxl_region cxl_port; do attr "$t/bus/cxl/drivers/$d/bind" ""; attr "$t/bus/cxl/drivers/$d/unbind" ""; done
	for d in device_dax kmem; do attr "$t/bus/dax/drivers/$d/bind" ""; attr "$t/bus/dax/drivers/$d/unbind" ""; done
	lnk "$t/bus/dax/drivers/$drv/dax0.0" "$dax"
	attr "$t/bus/cxl/flush" ""

	lnk "$t/bus/cxl/devices/root0" "$cd0"
	lnk "$t/bus/cxl/devices/port1" "$port"
	lnk "$t/bus/cxl/devices/endpoint2" "$ep"
	lnk "$t/bus/cxl/devices/mem0" "$mem"
	lnk "$t/bus/cxl/devices/decoder0.0" "$cd0/decoder0.0"
	lnk "$t/bus/cxl/devices/decoder1.0" "$port/decoder1.0"
	lnk "$t/bus/cxl/devices/decoder2.0" "$ep/decoder2.0"
	lnk "$t/bus/cxl/devices/decoder2.1" "$ep/decoder2.1"
	lnk "$t/bus/cxl/devices/region0" "$reg"
	lnk "$t/bus/cxl/devices/dax_region0" "$reg/dax_region0"
	lnk "$t/bus/dax/devices/dax0.0" "$dax"
}

# numa_common TREE ONLINE POSSIBLE: the node directory's top-level files.
numa_common() {
	attr "$1/devices/system/node/online" "$2"
	attr "$1/devices/system/node/possible" "$3"
	attr "$1/devices/system/node/has_cpu" 0
	attr "$1/devices/system/node/has_memory" "$2"
	attr "$1/devices/system/node/has_normal_memory" 0
}

rm -rf devdax numa plain numa-sametier

# devdax: 256 MiB of CXL ram exposed as /dev/dax0.0; the memory is not
# onlined, so node 1 is possible but not online.
cxl devdax device_dax 0x10000000 268435456 0 0x0
numa_common devdax 0 0-1
node devdax 0 0-3 10 8126464 7340032 "0 1 2 3"
tier devdax 4 0

# numa: 512 MiB of CXL ram onlined through kmem as memory-only node 1,
# with HMAT (access class 0) attributes and a slower memory tier.
cxl numa kmem 0x20000000 536870912 -1 0x2
numa_common numa 0-1 0-1
node numa 0 0-7 "10 20" 16252928 14680064 "0 1 2 3 4 5 6 7"
node numa 1 "" "20 10" 524288 520192 ""
attr numa/devices/system/node/has_memory 0-1
attr numa/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0/state online_movable
for n in 0 1; do
	i=numa/devices/system/node/node$n/access0/initiators
	lnk "$i/node0" numa/devices/system/node/node0
	lnk "numa/devices/system/node/node0/access0/targets/node$n" "numa/devices/system/node/node$n"
done
i=numa/devices/system/node/node0/access0/initiators
attr "$i/read_latency" 80
attr "$i/write_latency" 80
attr "$i/read_bandwidth" 51200
attr "$i/write_bandwidth" 51200
i=numa/devices/system/node/node1/access0/initiators
attr "$i/read_latency" 230
attr "$i/write_latency" 250
attr "$i/read_bandwidth" 25600
attr "$i/write_bandwidth" 12800
tier numa 4 0
tier numa 36 1

# plain: one node with two CPUs, no CXL bus, an empty dax bus.
numa_common plain 0 0
node plain 0 0-1 10 3892984 3432616 "0 1"
tier plain 4 0
attr plain/bus/dax/drivers_autoprobe 1
mkdir -p plain/bus/dax/devices plain/bus/dax/drivers
touch plain/bus/dax/devices/.gitkeep plain/bus/dax/drivers/.gitkeep

# numa-sametier: the numa tree on firmware without HMAT (no access0
# attributes), where the kernel placed CXL node 1 in DRAM's memory tier
# (memory_tier4 lists 0-1): demotion cannot tell the two apart.
cxl numa-sametier kmem 0x20000000 536870912 -1 0x2
numa_common numa-sametier 0-1 0-1
node numa-sametier 0 0-7 "10 20" 16252928 14680064 "0 1 2 3 4 5 6 7"
node numa-sametier 1 "" "20 10" 524288 520192 ""
attr numa-sametier/devices/system/node/has_memory 0-1
attr numa-sametier/devices/platform/ACPI0017:00/root0/decoder0.0/region0/dax_region0/dax0.0/state online_movable
tier numa-sametier 4 0-1
