# Sourced by cxl.sh: poold follows the kernel's device events. One poold,
# started while the region's memory is memory-only node N, must see within
# 2 s each change made after it started: the node taken offline and the
# memory back as a devdax device; the namespace destroyed (its device gone,
# its segment lost) and the region with it; a region created again (cxl
# create-region + ndctl create-namespace, as at boot) and placed on. A change the guest's tools refuse ends the sequence
# with a SKIP line that says why.

# within2s NAME WHAT CMD...: PASS when CMD succeeds within 2 s of now (tried
# every 0.1 s), saying how long it took; FAIL with poold's last lines if not.
within2s() {
	w_name=$1; w_what=$2; shift 2
	w_t0=$(ts)
	while :; do
		if "$@"; then res $w_name PASS "$w_what after $(awk -v a=$w_t0 -v b=$(ts) 'BEGIN{printf "%.2f s", b-a}')"; return 0; fi
		awk -v a=$w_t0 -v b=$(ts) 'BEGIN{exit !(b-a>2)}' && break
		sleep 0.1
	done
	res $w_name FAIL "$w_what not within 2 s; poold: $(tail -3 $OUT/hp.log | tr '\n' ' ' | cut -c1-240)"
	return 1
}

# logged NAME WHAT LINES T0: poold's own time for the change: the time= of
# the first "device appeared" line its log gained after its first LINES
# lines, less T0 (date +%s.%N when the tool returned; negative when poold
# placed on the device before the tool was done). A check by memctl in this
# emulated guest takes about a second itself, so this is the figure the
# 2 s bound is held to.
logged() {
	l_t=$(tail -n +$(($3 + 1)) $OUT/hp.log | grep -m1 'device appeared' | sed -n 's/^time=\([^ ]*\).*/\1/p')
	if [ -z "$l_t" ]; then res $1 FAIL "$2: no 'device appeared' line in poold's log"; return 1; fi
	l_d=$(awk -v a=$4 -v b=$(date -d "$l_t" +%s.%N) 'BEGIN{printf "%.2f", b-a}')
	if awk -v d=$l_d 'BEGIN{exit !(d<=2)}'; then res $1 PASS "$2 $l_d s after the tool returned (poold's log)"
	else res $1 FAIL "$2 only $l_d s after the tool returned (poold's log)"; fi
}

# tiers_has / tiers_lacks ERE: whether memctl tiers has a line matching ERE.
tiers_has() { $B/memctl --socket /tmp/hp.sock tiers 2>/dev/null | grep -q -E "$1"; }
tiers_lacks() { $B/memctl --socket /tmp/hp.sock tiers >/tmp/hp.tiers 2>/dev/null && ! grep -q -E "$1" /tmp/hp.tiers; }
hp_offlined() { tiers_lacks "numa.*node$1" && tiers_has '^cxl +devdax +real.*dax[0-9]+\.[0-9]'; }
hp_lost() { $B/memctl --socket /tmp/hp.sock segments 2>/dev/null | grep -E ' lab-hp ' | grep -q -i lost; }

# hp_tool NAME CMD...: run a guest tool; on failure a SKIP line with its
# output, and the hotplug sequence ends.
hp_tool() {
	t_name=$1; shift
	if "$@" >/tmp/hp.out 2>&1; then return 0; fi
	res $t_name SKIP "'$*' refused: $(tr '\n' ' ' < /tmp/hp.out | cut -c1-200)"
	poold_stop hp
	return 1
}

# hotplug NODE: the sequence above, starting from dax0.0 as system-ram node NODE.
hotplug() {
	hp_n=$1
	# Only real CXL memory: no emulated tier to hide behind.
	poold_start hp --allow-devdax-fd --measure-tiers=false --emulate-cxl 0 || { res hotplug FAIL "poold did not start"; return 1; }
	if tiers_has "^cxl +numa +real.*node$hp_n"; then res hotplug-start PASS "poold serves node$hp_n"
	else res hotplug-start FAIL "memctl tiers shows no numa tier on node$hp_n"; poold_stop hp; return 1; fi

	# Offline: the node's memory goes offline and comes back as devdax.
	hp_lines=$(wc -l < $OUT/hp.log)
	hp_tool hotplug-node-offline daxctl reconfigure-device --mode=devdax -f dax0.0 || return 0
	hp_t0=$(date +%s.%N)
	within2s hotplug-node-offline "node$hp_n gone and dax0.0 placed on as devdax" hp_offlined $hp_n
	logged hotplug-node-offline-poold "poold placed on dax0.0" $hp_lines $hp_t0
	$B/labcheck put -socket /tmp/hp.sock -tier cxl -name lab-hp -size 8MiB -want-kind devdax -persist

	# The namespace destroyed under poold (its labels too, or the region
	# made again would find them): the device goes, its segment is lost.
	# Then the region goes.
	hp_tool hotplug-device-gone ndctl destroy-namespace -f all || return 0
	within2s hotplug-device-gone "the dax device gone from the tiers" tiers_lacks 'dax[0-9]+\.[0-9]'
	within2s hotplug-segment-lost "segment lab-hp on it reported lost" hp_lost
	hp_region=$(cxl list -R | sed -n 's/.*"region":"\(region[0-9]*\)".*/\1/p' | head -1)
	hp_tool hotplug-region-destroyed cxl destroy-region -f "$hp_region" || return 0

	# A region created after poold started, as at boot (the nd region may
	# take another number: create-namespace picks the one with room).
	hp_tool hotplug-region-created cxl create-region -m -d decoder0.0 -w 1 -t pmem -s 256M mem0 || return 0
	hp_lines=$(wc -l < $OUT/hp.log)
	hp_tool hotplug-region-created ndctl create-namespace -m devdax -f || return 0
	hp_t0=$(date +%s.%N)
	within2s hotplug-region-created "the new region's devdax device placed on" tiers_has '^cxl +devdax +real.*dax[0-9]+\.[0-9]'
	logged hotplug-region-created-poold "poold placed on the new region's device" $hp_lines $hp_t0
	$B/labcheck put -socket /tmp/hp.sock -tier cxl -name lab-hp2 -size 8MiB -want-kind devdax -persist
	poold_stop hp
}
