// Package paths says where poold and its clients find each other and where
// the daemon keeps its state when nothing is configured, and how a client's
// target ("", a socket path, tcp://HOST:PORT) is read: the daemon, the
// client library and memctl share it so that all agree without configuration.
//
// It also knows poold's shared-memory directories (/dev/shm/farmem-UID-HASH):
// the owner file a daemon writes there, and ScanShm, which tells the ones a
// running poold uses from those left behind (memctl doctor lists them).
// ScanShm reads the kernel's lock table, which only Linux offers; elsewhere
// every directory is reported in use.
//
// The functions read the environment each time; they are safe for concurrent use.
package paths
