package mmap

// Cache-line write-back instructions, best first: CLWB writes a line back
// and may keep it cached; CLFLUSHOPT and CLFLUSH evict it. All three
// followed by SFENCE make the stores before them reach the memory
// controller, which on a platform with ADR (every one that supports
// persistent memory) is inside the persistence domain.
const (
	opCLFLUSH = iota
	opCLFLUSHOPT
	opCLWB
)

// flushOp is the best instruction this CPU has (CPUID leaf 7, EBX bits 23
// and 24); CLFLUSH is in every x86-64 CPU.
var flushOp = func() int {
	_, ebx, _, _ := cpuid(7, 0)
	switch {
	case ebx&(1<<24) != 0:
		return opCLWB
	case ebx&(1<<23) != 0:
		return opCLFLUSHOPT
	}
	return opCLFLUSH
}()

// FlushMethod names the instruction Flush uses on this CPU.
func FlushMethod() string {
	return [...]string{"clflush", "clflushopt", "clwb"}[flushOp] + "+sfence"
}

// Flush writes the CPU cache lines holding b back to memory and waits
// (SFENCE): on persistent memory mapped directly (devdax, or MAP_SYNC), what
// makes stores durable. A fault on an address of b that is not mapped (or
// poisoned) is the caller's to guard (runtime/debug.SetPanicOnFault).
func Flush(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	flushLines(&b[0], uintptr(len(b)), flushOp)
	return nil
}

// cpuid is the CPUID instruction (flush_amd64.s).
func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)

// flushLines writes back every 64-byte line of [p, p+n) with instruction
// op, then SFENCE (flush_amd64.s).
//
//go:noescape
func flushLines(p *byte, n uintptr, op int)
