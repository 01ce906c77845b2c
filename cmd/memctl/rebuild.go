package main

import poolv1 "github.com/farmem/farmem/api/pool/v1"

// rebuildProgress sums the bytes copied so far to s's rebuilding homes,
// and to the replacements of its moving homes, and the bytes they hold
// when done (each home holds the whole segment, or one shard: size / data
// shards).
func rebuildProgress(s *poolv1.Segment) (done, total int64) {
	per := s.Size
	if k := s.GetRedundancy().GetDataShards(); k > 0 {
		per = s.Size / int64(k)
	}
	for _, h := range s.Homes {
		if h.State == poolv1.HomeState_HOME_STATE_REBUILDING || h.MovingTo != "" {
			done += min(h.RebuiltBytes, per)
			total += per
		}
	}
	return done, total
}
