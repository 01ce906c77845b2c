#!/bin/sh
# CXL checks: region -> devdax -> poold on /dev/dax0.0 (fd passing, kill -9)
# -> system-ram -> poold on the memory-only NUMA node; sysfs snapshots of
# both modes for cxl/testdata; then hotplug: one poold follows the node
# going offline, the region destroyed and created again (lab/guest/hotplug.sh).
. /lab/common.sh
POOLD=$B/poold
echo "LAB: cxl kernel=$(uname -r) ndctl=$(ndctl version) uptime=$(ts)"
for m in cxl_acpi cxl_pci cxl_port cxl_mem cxl_pmem libnvdimm nd_pmem dax_pmem device_dax kmem; do modprobe $m 2>/dev/null; done
udevadm settle
if cxl list -M | grep -q '"memdev":"mem0"'; then res cxl-memdev PASS "mem0: $(cxl list -M | tr -d '\n ' | cut -c1-120)"
else res cxl-memdev FAIL "no mem0"; dmesg | grep -i cxl | tail; exit 1; fi
cxl create-region -m -d decoder0.0 -w 1 -t pmem -s 256M mem0 >/dev/null
if cxl list -R | grep -q '"decode_state":"commit"'; then res cxl-region PASS "region0 committed"
else res cxl-region FAIL "cxl create-region"; dmesg | grep -i -E 'cxl|region' | tail; exit 1; fi
ndctl create-namespace -r region0 -m devdax -f >/dev/null
if [ -c /dev/dax0.0 ]; then res cxl-devdax PASS "/dev/dax0.0 $(daxctl list | tr -d '\n ' | cut -c1-120)"
else res cxl-devdax FAIL "no /dev/dax0.0"; exit 1; fi
$B/labcheck snap -o $OUT/qemu-devdax.tar -name sysfs-snapshot-devdax

# 1. poold with no configuration beyond its paths; --allow-devdax-fd lets it
# hand the devdax descriptor to clients (without it the device is listed but
# not used, and memctl tiers says why).
poold_start dax --allow-devdax-fd --measure-tiers=false || { res poold-devdax FAIL "did not start"; exit 1; }
$B/memctl --socket /tmp/dax.sock tiers | tee /tmp/tiers.dax
if grep -q -E '^cxl +devdax +real.*dax0\.0' /tmp/tiers.dax; then res poold-discovers-devdax PASS "$(grep -E '^cxl' /tmp/tiers.dax | tr -s ' ' | cut -c1-150)"
else res poold-discovers-devdax FAIL "memctl tiers shows no real devdax tier on dax0.0"; fi
grep -o 'using CXL devdax device.*' $OUT/dax.log | head -1
$B/labcheck put -socket /tmp/dax.sock -tier cxl -name lab-dax -size 8MiB -want-kind devdax
$B/labcheck get -socket /tmp/dax.sock -name lab-dax -check devdax-fd-other-client
doctor dax doctor-devdax 'devdax|dax0\.0'
poold_stop dax KILL
poold_start dax --allow-devdax-fd --measure-tiers=false || res poold-restart FAIL "did not restart after kill -9"
$B/labcheck get -socket /tmp/dax.sock -name lab-dax -check devdax-survives-kill9
$B/memctl --socket /tmp/dax.sock free lab-dax >/dev/null
poold_stop dax

# 2. system-ram: the region becomes a memory-only NUMA node. It must not be
# node 0 (no SRAT -> CXL pages mixed into node 0 -> virtio hangs, since QEMU
# cannot DMA into CXL memory).
TN=$(cat /sys/bus/dax/devices/dax0.0/target_node)
if [ "$TN" = 0 ] || [ -z "$TN" ]; then res daxctl-system-ram FAIL "dax0.0 target_node=$TN (no SRAT? use -m X,maxmem=Y,slots=N)"; res hotplug SKIP "no memory-only node to start from (above)"; exit 0; fi
daxctl reconfigure-device --mode=system-ram -f dax0.0 >/dev/null
if numactl -H | grep -q "node $TN size: [1-9]"; then res daxctl-system-ram PASS "$(numactl -H | grep "node $TN size") cpus: '$(cat /sys/devices/system/node/node$TN/cpulist)'"
else res daxctl-system-ram FAIL "node $TN has no memory"; res hotplug SKIP "no memory-only node to start from (above)"; exit 0; fi
$B/labcheck snap -o $OUT/qemu-numa.tar -name sysfs-snapshot-numa
poold_on_node numa $TN || { res hotplug SKIP "poold did not start on the node (above)"; exit 1; }

# 3. Hotplug: CXL memory that comes and goes while poold runs.
. /lab/hotplug.sh
hotplug $TN
