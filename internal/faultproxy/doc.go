// Package faultproxy is a test helper: a TCP proxy that forwards
// connections to a target and breaks them on purpose, to check what
// clients promise when connections fail mid-flight. It kills every
// connection it carries on demand or on a period (what `ss -K` does to a
// live data plane), and can cut a connection after a chosen number of
// reply bytes, so that requests reach the target while their replies are
// lost. It can also hand every forwarded byte to a recorder
// (Config.Record), to check what an eavesdropper on the wire would see.
//
// A Proxy is safe for concurrent use. It uses only loopback sockets in the
// tests that start it, and needs no privileges; any OS.
package faultproxy
