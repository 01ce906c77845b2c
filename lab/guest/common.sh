# Sourced by the guest scripts: result lines and poold helpers.
ts() { cut -d' ' -f1 /proc/uptime; }
res() { echo "LAB-RESULT $1 $2 $3"; }
B=/lab/bin
OUT=/lab/out
mkdir -p $OUT

# poold_start NAME ARGS...: start a poold whose socket, data and shm dirs
# are /tmp/NAME*, log in $OUT/NAME.log; wait until its socket answers.
# The guests have 2 GiB of RAM, so /dev/shm holds a little under 1 GiB:
# poold refuses its default 1 GiB export there, and the rdma tier's memory
# is 64 MiB unless ARGS say otherwise (a later flag wins).
poold_start() {
	n=$1; shift
	$POOLD --socket /tmp/$n.sock --data-dir /tmp/$n.data --shm-dir /dev/shm/$n --export-size 64MiB "$@" >> $OUT/$n.log 2>&1 &
	eval "PID_$n=$!"
	for i in $(seq 1 100); do
		$B/memctl --socket /tmp/$n.sock status >/dev/null 2>&1 && return 0
		kill -0 "$(eval echo \$PID_$n)" 2>/dev/null || break
		sleep 0.2
	done
	echo "poold $n did not come up; its log:"; tail -20 $OUT/$n.log
	return 1
}

# poold_stop NAME [SIGNAL]
poold_stop() {
	p=$(eval echo \$PID_$1)
	[ -n "$p" ] || return 0
	kill -${2:-TERM} "$p" 2>/dev/null
	for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
	wait "$p" 2>/dev/null
	eval "PID_$1="
}

# poold_on_node NAME NODE [PREFIX]: poold with no configuration on a guest
# whose CXL memory is memory-only node NODE: memctl tiers must show it as a
# real numa cxl tier, a segment's pages must land on it, and doctor must
# explain it. PREFIX starts the result names. Fails when poold does not start.
poold_on_node() {
	# Own names: poold_start and poold_stop set n and p.
	on_n=$1; on_tn=$2; on_p=${3:-}
	poold_start $on_n --measure-tiers=false || { res ${on_p}poold-$on_n FAIL "did not start"; return 1; }
	$B/memctl --socket /tmp/$on_n.sock tiers | tee /tmp/tiers.$on_n
	if grep -q -E "^cxl +numa +real.*node$on_tn" /tmp/tiers.$on_n; then res ${on_p}poold-discovers-numa-node PASS "$(grep -E '^cxl' /tmp/tiers.$on_n | tr -s ' ' | cut -c1-150)"
	else res ${on_p}poold-discovers-numa-node FAIL "memctl tiers shows no real numa tier on node$on_tn"; fi
	$B/labcheck numa -socket /tmp/$on_n.sock -node $on_tn -size 8MiB -check ${on_p}numa-pages
	doctor $on_n ${on_p}doctor-numa "node ?$on_tn|numa|system-ram"
	poold_stop $on_n
}

# doctor NAME CHECK: run memctl doctor when this memctl has it.
doctor() {
	if $B/memctl doctor --help >/dev/null 2>&1; then
		if $B/memctl --socket /tmp/$1.sock doctor > /tmp/doctor.$2 2>&1; then st=PASS; else st=FAIL; fi
		cat /tmp/doctor.$2
		if [ -n "${3:-}" ] && ! grep -q -i -E "$3" /tmp/doctor.$2; then st=FAIL; fi
		res "$2" $st "$(grep -i -E "${3:-.}" /tmp/doctor.$2 | head -2 | tr '\n' ' ' | cut -c1-200)"
	else
		res "$2" SKIP "this memctl has no doctor subcommand yet"
	fi
}
