// Package uevent reads the kernel's device events (uevents): the messages
// the kernel multicasts on a NETLINK_KOBJECT_UEVENT socket when a device is
// added, removed, bound to a driver, or brought online or offline. poold
// follows them to see CXL regions, DAX devices, memory blocks and NUMA
// nodes come and go while it runs.
//
// A kernel message is one datagram of NUL-separated fields:
//
//	+---------------------+----+----------------+----+-----+----------------+----+
//	| ACTION "@" DEVPATH  | \0 | KEY "=" VALUE  | \0 | ... | KEY "=" VALUE  | \0 |
//	+---------------------+----+----------------+----+-----+----------------+----+
//	  "add@/devices/platform/ACPI0017:00/root0/decoder0.0/region0"
//	                             "ACTION=add", "DEVPATH=...", "SUBSYSTEM=cxl",
//	                             "SEQNUM=1234", and more keys per subsystem
//
// (lib/kobject_uevent.c; at most 64 keys in 2048 bytes). [Parse] decodes
// one; messages udev re-broadcasts ("libudev" header, multicast group 2)
// are not kernel messages and are refused, as is anything malformed, with
// an error matching [ErrMalformed].
//
// [Listen] opens the socket (Linux only; elsewhere it returns an error
// matching errs.ErrNotSupported). Every process may listen; events of
// devices other than network interfaces reach only sockets in the initial
// network namespace, so a daemon started in a namespace of its own hears
// none. A listener that falls behind loses events: Receive then returns
// an error matching [ErrOverflow], and the reader should rescan whatever
// it follows rather than trust the events. [Inject] has the kernel send a
// synthetic event to the listeners of the caller's network namespace.
//
// Concurrency: [Parse] and [Event] are pure values, safe for concurrent
// use. A [Socket] may be closed from any goroutine while another blocks
// in Receive, which then returns an error matching os.ErrClosed; Receive
// itself is for one goroutine at a time.
package uevent
