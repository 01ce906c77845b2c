// Package bench is the load generator behind 'memctl bench': one
// closed-loop generator (Run) that drives any System — a farmem tier
// through alloc.Segment, a plain []byte, a raw pipelined TCP server, a
// gRPC unary service, memcached or Redis — with reads, writes or 64-bit
// atomics of one size at a given number of operations in flight, and
// records for each case a latency histogram (log-linear buckets, ≤ 3 %
// relative error), operations per second, and CPU time per operation on
// the client (this process's rusage over the run) and, where the server
// is another local process, on the server (its threads' CPU time from
// /proc over the run).
//
// Depth d means d goroutines each with one operation outstanding: on
// farmem's rdma tier they share the client's pipelined connections; on
// memcached and Redis each has its own connection, as applications use
// them; on the raw TCP server they share one pipelined connection.
//
// Report turns results into rows (Row), sets ratios against farmem's
// matching tier (Compare), checks the README's targets (Targets), prints a
// table (WriteTable) and plots latency CDFs (PlotCDF, PNG or SVG via
// gonum.org/v1/plot).
//
// Concurrency: Run calls a System's Do from several goroutines at once,
// so Systems are safe for concurrent use; Histogram is not (the generator
// keeps one per goroutine and merges them). Rows are plain values.
//
// OS and build tags: process and server CPU times and finding the process
// behind a listening port read /proc and getrusage on Linux; elsewhere
// they are reported as unknown. Everything else is portable.
package bench
