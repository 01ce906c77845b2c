package verbs

// AtomicScope is what a device's RDMA atomics are atomic with: its
// ibv_device_attr.atomic_cap. A plain value.
type AtomicScope int

// The scopes, as libibverbs names them.
const (
	// AtomicNone (IBV_ATOMIC_NONE): the device has no atomics.
	AtomicNone AtomicScope = iota
	// AtomicHCA (IBV_ATOMIC_HCA): atomic only with other atomics of the
	// same device; a CPU atomic on the same word can interleave.
	AtomicHCA
	// AtomicGlobal (IBV_ATOMIC_GLOB): atomic with every other access,
	// the host CPU's atomics included.
	AtomicGlobal
)

// AtomicsOnDevice reports whether compare-and-swap and fetch-and-add may
// be executed by a device of scope s. The home's CPU serves the atomics of
// tcp peers on the same words, so the device's must be atomic with the
// CPU's: only AtomicGlobal qualifies. Otherwise the client sends its
// atomics over the tcp transport, where the home's CPU executes them.
func AtomicsOnDevice(s AtomicScope) bool { return s == AtomicGlobal }
