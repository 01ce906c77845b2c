package alloc

// AbandonShared drops a shared attachment as a crashed process would: no
// write-back, no release (tests of sharer death).
func AbandonShared(s *SharedSegment) { s.abandon() }
