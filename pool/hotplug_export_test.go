package pool

import (
	"os"
	"sync"
)

// feed is a source of device events that a test writes to.
type feed struct {
	msgs chan []byte
	done chan struct{}
	once sync.Once
}

func (f *feed) Receive(buf []byte) (int, error) {
	select {
	case m := <-f.msgs:
		return copy(buf, m), nil
	case <-f.done:
		return 0, os.ErrClosed
	}
}

func (f *feed) Close() error {
	f.once.Do(func() { close(f.done) })
	return nil
}

// FeedUevents makes a daemon started with cfg hear the kernel's device
// events from the returned function instead of the netlink socket.
func FeedUevents(cfg *Config) (send func(msg []byte)) {
	f := &feed{msgs: make(chan []byte, 4096), done: make(chan struct{})}
	cfg.Hotplug = true
	cfg.sim.uevents = func() (ueventSource, error) { return f, nil }
	return func(msg []byte) {
		select {
		case f.msgs <- msg:
		case <-f.done:
		}
	}
}
