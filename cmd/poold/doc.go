// Command poold is farmem's per-host daemon: it owns the host's far memory
// (CXL devdax devices, memory-only NUMA nodes, or an emulated CXL device when
// the host has none, plus a local DRAM tier) and lends it to applications.
//
// With no flags it runs on a fresh machine: see 'poold --help'.
package main
