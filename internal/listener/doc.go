// Package listener keeps a daemon's listeners accepting under hostile load.
//
// A Listener wraps a net.Listener so that Accept survives the errors a flood
// of connections provokes: when the process runs out of descriptors
// (EMFILE), the system does (ENFILE), or the kernel lacks buffers or memory
// (ENOBUFS, ENOMEM), Accept backs off (5ms doubling to 1s, as net/http does)
// and tries again instead of returning the error, which would make
// net/http, gRPC or a hand-written accept loop stop serving for good. A
// connection that died in the backlog (ECONNABORTED, ECONNRESET, EPROTO,
// EPERM from a firewall rule) is skipped at once. Accept returns an error
// only once the listener is closed.
//
// While it backs off the Listener reports itself failing (Status), so that
// readiness probes and placement can tell the truth; it recovers by itself
// at the next successful Accept, or FailWindow after the last error. Errors
// are counted through Config.OnError and logged through a
// logsample.Sampler: at most one line per logsample.Interval, with the
// number held back meanwhile.
//
// Slots count what each source (an IP, a process) holds under a total and
// a per-source limit. A Handshakes listener uses them to bound the
// connections whose handshake has not finished yet (a TLS or HTTP/2
// preface), refusing (closing) the ones beyond either limit at once, so
// that one source opening thousands of idle connections cannot hold the
// descriptors and goroutines that legitimate clients need; Settle marks a
// connection's handshake finished.
//
// A Conns listener bounds the connections open at once the same way, for
// servers whose clients keep connections idle between requests (HTTP
// keep-alive): at a limit it closes the oldest idle connection (the
// source's own at its limit, anyone's at the total) to make room, and
// refuses the new one only when all those are busy; SetIdle marks them.
//
// Every exported type is safe for concurrent use. The package needs no
// particular OS; the errno classification is that of syscall on Unix.
package listener
