// Package paths says where poold and its clients find each other and where
// the daemon keeps its state when nothing is configured. The daemon and the
// client library share it so that both agree without configuration.
//
// The functions read the environment each time; they are safe for concurrent use.
package paths
