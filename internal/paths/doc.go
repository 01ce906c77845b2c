// Package paths says where poold and its clients find each other and where
// the daemon keeps its state when nothing is configured, and how a client's
// target ("", a socket path, tcp://HOST:PORT) is read: the daemon, the
// client library and memctl share it so that all agree without configuration.
//
// The functions read the environment each time; they are safe for concurrent use.
package paths
