package alloc

// RefPlace tells tests where an object lies: its segment's id, its offset
// in the segment and its slot size.
func RefPlace(a *Arena, r Ref) (seg uint64, off, size int64, err error) {
	s, slot, err := a.lookup(r)
	if err != nil {
		return 0, 0, 0, err
	}
	if _, err := s.live(r); err != nil {
		return 0, 0, 0, err
	}
	return s.seg.seg.ID(), s.base + int64(slot)*int64(s.size), int64(s.size), nil
}
