package outbox

// floors remembers, for a bounded number of keys, the highest seq of the key whose outcome
// (published or dead-lettered) the store recorded for this relay: the key's floor.
//
// A continuation fetch takes a key's message only if the key has no pending message at or
// below the cursor that the relay has not handled. Without a floor, the store checks that
// from the key's first seq, and under a pinned xmin horizon that walks every index entry
// the key's published rows left behind since the pin began. The floor lets it start at the
// key's last recorded outcome instead.
//
// Invariant: once the store recorded a key's message at seq s for this relay, no message of
// the key below s is pending except one whose transaction committed after s was fetched (a
// late commit, concurrent with s's transaction, whose order the guarantees leave open) or
// a dead letter an operator replayed (it keeps its seq and is published after successors
// of its key by design; docs/operations.md, "Replay"). Why: the relay sent s only after
// every earlier visible message of the key was confirmed and recorded (one message of a
// key in flight, none past a rejection); a published row never becomes pending again, and
// the pending ring moves rows that are pending already. The invariant survives losing and
// regaining the key's shard: another owner only publishes or retries messages above s.
//
// Forgetting a floor is always safe (the check starts from the key's first seq again), so
// when full, floors drops arbitrary keys.
type floors struct {
	max int
	seq map[string]int64
}

func newFloors(max int) *floors {
	return &floors{max: max, seq: make(map[string]int64)}
}

// raise records an outcome of key at seq. Messages without a key have no order to keep.
func (f *floors) raise(key string, seq int64) {
	if key == "" || seq <= f.seq[key] {
		return
	}
	if _, ok := f.seq[key]; !ok && len(f.seq) >= f.max {
		for k := range f.seq { // Go's map order: an arbitrary key
			delete(f.seq, k)
			break
		}
	}
	f.seq[key] = seq
}

// bounds returns, for a continuation, each remembered key's floor raised to held[key],
// the highest seq of the key the relay holds, with the held keys that have no floor. With
// backlog false it returns the held keys alone: a continuation woken by a notification
// reads the few messages just written, and the floors of every key (up to keyFloors, tens
// of kilobytes to encode and decode each time) cost it several times more than the few
// index entries they let each of those messages' checks skip. They are for a backlog,
// whose keys each left many published rows behind in one bucket.
func (f *floors) bounds(held map[string]int64, backlog bool) (keys []string, seqs []int64) {
	n := len(held)
	if backlog {
		n += len(f.seq)
	}
	keys, seqs = make([]string, 0, n), make([]int64, 0, n)
	if backlog {
		for k, s := range f.seq {
			keys = append(keys, k)
			seqs = append(seqs, max(s, held[k]))
		}
	}
	for k, s := range held {
		if floor, ok := f.seq[k]; !ok || !backlog {
			keys = append(keys, k)
			seqs = append(seqs, max(s, floor))
		}
	}
	return keys, seqs
}
