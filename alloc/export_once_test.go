package alloc

// WithDataAddr makes the client dial f(addr) for the data plane at addr:
// the tests put a fault-injecting proxy between the client and the home.
func WithDataAddr(f func(string) string) DialOption {
	return func(o *dialOptions) { o.dataAddr = f }
}

// DataSecrets returns what the data plane's handshake and requests carry
// for s: the credential presented and the segment's access key.
func DataSecrets(s *Segment) (cred, key []byte) {
	r := s.base().(*remote)
	p := r.plane.Load()
	cred = r.credential(p)
	k := p.region.Key
	return cred, k[:]
}

// RaceEnabled reports whether the race detector is on (race_test.go).
const RaceEnabled = raceEnabled
