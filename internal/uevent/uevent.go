package uevent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Limits of a kernel message (include/linux/kobject.h: UEVENT_NUM_ENVP 64,
// UEVENT_BUFFER_SIZE 2048). Parse refuses anything larger, so a garbage
// datagram cannot make it allocate much.
const (
	// MaxMessage is the largest message Parse accepts, in bytes: the
	// kernel's buffer plus the "ACTION@DEVPATH" header.
	MaxMessage = 2048 + 4096
	// MaxKeys is the most KEY=VALUE fields Parse accepts.
	MaxKeys = 64
)

var (
	// ErrMalformed reports a datagram that is not a kernel uevent: empty,
	// too large, without its ACTION@DEVPATH header, a field without "=",
	// a header that disagrees with its ACTION or DEVPATH key, or a
	// message udev re-broadcast.
	ErrMalformed = errors.New("uevent: malformed message")

	// ErrOverflow reports that the socket's receive buffer overflowed and
	// events were lost: rescan what the events would have told.
	ErrOverflow = errors.New("uevent: events lost (receive buffer overflowed)")
)

// Event is one decoded uevent. Plain value, safe for concurrent reads.
type Event struct {
	// Action is what happened: add, remove, change, move, online,
	// offline, bind, unbind.
	Action string
	// DevPath is the device's path below /sys, "/devices/.../dax0.0".
	DevPath string
	// Subsystem is the device's subsystem: dax, cxl, memory, node, nd...;
	// empty when the message has no SUBSYSTEM key.
	Subsystem string
	// Seqnum is the kernel's event number; 0 when absent.
	Seqnum uint64
	// Env holds every KEY=VALUE field, SUBSYSTEM and SEQNUM included, and
	// ACTION and DEVPATH also when the message has only its header.
	Env map[string]string
}

// Parse decodes one kernel uevent datagram. It fails with an error matching
// ErrMalformed that names what is wrong and where.
func Parse(msg []byte) (Event, error) {
	if len(msg) == 0 {
		return Event{}, fmt.Errorf("%w: empty datagram", ErrMalformed)
	}
	if len(msg) > MaxMessage {
		return Event{}, fmt.Errorf("%w: %d bytes, more than the kernel sends (%d)", ErrMalformed, len(msg), MaxMessage)
	}
	if strings.HasPrefix(string(msg), "libudev\x00") {
		return Event{}, fmt.Errorf("%w: a udev re-broadcast (libudev header), not a kernel message; listen on multicast group 1", ErrMalformed)
	}
	fields := strings.Split(strings.TrimSuffix(string(msg), "\x00"), "\x00")
	action, devpath, ok := strings.Cut(fields[0], "@")
	if !ok || action == "" || !strings.HasPrefix(devpath, "/") {
		return Event{}, fmt.Errorf("%w: header %q is not ACTION@/DEVPATH", ErrMalformed, clip(fields[0]))
	}
	if len(fields)-1 > MaxKeys {
		return Event{}, fmt.Errorf("%w: %d fields, more than the kernel sends (%d)", ErrMalformed, len(fields)-1, MaxKeys)
	}
	ev := Event{Action: action, DevPath: devpath, Env: make(map[string]string, len(fields)-1)}
	for i, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return Event{}, fmt.Errorf("%w: field %d %q is not KEY=VALUE", ErrMalformed, i+1, clip(f))
		}
		ev.Env[k] = v
	}
	if a, ok := ev.Env["ACTION"]; ok && a != action {
		return Event{}, fmt.Errorf("%w: header action %q but ACTION=%q", ErrMalformed, clip(action), clip(a))
	}
	if p, ok := ev.Env["DEVPATH"]; ok && p != devpath {
		return Event{}, fmt.Errorf("%w: header path %q but DEVPATH=%q", ErrMalformed, clip(devpath), clip(p))
	}
	ev.Env["ACTION"], ev.Env["DEVPATH"] = action, devpath
	ev.Subsystem = ev.Env["SUBSYSTEM"]
	if s, ok := ev.Env["SEQNUM"]; ok {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return Event{}, fmt.Errorf("%w: SEQNUM=%q is not a number", ErrMalformed, clip(s))
		}
		ev.Seqnum = n
	}
	return ev, nil
}

// Bytes encodes the event as the kernel would: the header, then ACTION,
// DEVPATH, SUBSYSTEM and SEQNUM (when set), then the other keys of Env in
// sorted order. Parse(e.Bytes()) gives back e's fields and keys.
func (e Event) Bytes() []byte {
	var b strings.Builder
	field := func(s string) { b.WriteString(s); b.WriteByte(0) }
	field(e.Action + "@" + e.DevPath)
	field("ACTION=" + e.Action)
	field("DEVPATH=" + e.DevPath)
	if e.Subsystem != "" {
		field("SUBSYSTEM=" + e.Subsystem)
	}
	if e.Seqnum != 0 {
		field("SEQNUM=" + strconv.FormatUint(e.Seqnum, 10))
	}
	for _, k := range slices.Sorted(maps.Keys(e.Env)) {
		switch k {
		case "ACTION", "DEVPATH", "SUBSYSTEM", "SEQNUM":
			continue
		}
		field(k + "=" + e.Env[k])
	}
	return []byte(b.String())
}

// clip cuts s to 64 bytes for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
