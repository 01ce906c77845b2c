#!/bin/sh
# Volatile CXL checks (QEMU 10, kernel 6.12): a cxl-type3 volatile-memdev,
# what a CXL memory expander is. cxl create-region -t ram; the kernel's
# dax_cxl driver makes the dax device, which becomes a memory-only NUMA
# node; poold with no configuration must find that node and place segments
# on it. The sysfs tree is snapshotted for cxl/testdata/qemu-ram.
. /lab/common.sh
POOLD=$B/poold
echo "LAB: cxl-ram kernel=$(uname -r) ndctl=$(ndctl version) uptime=$(ts)"
for m in cxl_acpi cxl_pci cxl_port cxl_mem dax_cxl device_dax kmem; do modprobe $m 2>/dev/null; done
udevadm settle
if cxl list -M | grep -q '"ram_size"'; then res cxl-ram-memdev PASS "mem0: $(cxl list -M | tr -d '\n ' | cut -c1-120)"
else res cxl-ram-memdev FAIL "no memdev with volatile capacity: $(cxl list -M | tr -d '\n ')"; dmesg | grep -i cxl | tail; exit 1; fi
cxl create-region -m -d decoder0.0 -w 1 -t ram -s 256M mem0 >/dev/null
if cxl list -R | grep -q '"decode_state":"commit"'; then res cxl-ram-region PASS "$(cxl list -R | tr -d '\n ' | cut -c1-120)"
else res cxl-ram-region FAIL "cxl create-region -t ram"; dmesg | grep -i -E 'cxl|region' | tail; exit 1; fi
udevadm settle; sleep 1
DAX=$(daxctl list | sed -n 's/.*"chardev":"\([^"]*\)".*/\1/p' | head -1)
MODE=$(daxctl list | sed -n 's/.*"mode":"\([^"]*\)".*/\1/p' | head -1)
[ -n "$DAX" ] || { res cxl-ram-dax FAIL "dax_cxl made no dax device"; exit 1; }
# Whether the kernel onlines it by itself depends on the memory hotplug
# policy; a memory expander is used as system-ram either way.
[ "$MODE" = system-ram ] || daxctl reconfigure-device --mode=system-ram -f "$DAX" >/dev/null
TN=$(cat /sys/bus/dax/devices/$DAX/target_node)
if [ -n "$TN" ] && [ "$TN" != 0 ] && numactl -H | grep -q "node $TN size: [1-9]" && [ -z "$(cat /sys/devices/system/node/node$TN/cpulist)" ]; then
	res cxl-ram-numa-node PASS "$DAX (was $MODE) -> $(numactl -H | grep "node $TN size"), no CPUs"
else res cxl-ram-numa-node FAIL "$DAX target_node=$TN: $(numactl -H | grep "node $TN size")"; exit 1; fi
$B/labcheck snap -o $OUT/qemu-ram.tar -name sysfs-snapshot-ram

poold_on_node ram $TN cxl-ram- || exit 1
