package alloc

// WithDataAddr makes the client dial f(addr) for the data plane at addr:
// the tests put a fault-injecting proxy between the client and the home.
func WithDataAddr(f func(string) string) DialOption {
	return func(o *dialOptions) { o.dataAddr = f }
}
