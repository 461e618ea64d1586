package outbox

import (
	"maps"
	"testing"
)

func TestFloors(t *testing.T) {
	bounds := func(f *floors, held map[string]int64, backlog bool) map[string]int64 {
		keys, seqs := f.bounds(held, backlog)
		if len(keys) != len(seqs) {
			t.Fatalf("%d keys, %d seqs", len(keys), len(seqs))
		}
		got := make(map[string]int64, len(keys))
		for i, k := range keys {
			if _, dup := got[k]; dup {
				t.Fatalf("key %q twice", k)
			}
			got[k] = seqs[i]
		}
		return got
	}
	for _, tc := range []struct {
		name  string
		raise []struct {
			key string
			seq int64
		}
		held map[string]int64
		want map[string]int64
		// notified is what a continuation woken by a notification sends: the held keys
		// alone, each raised to its floor.
		notified map[string]int64
	}{
		{name: "nothing", want: map[string]int64{}, notified: map[string]int64{}},
		{name: "held only", held: map[string]int64{"a": 7}, want: map[string]int64{"a": 7}, notified: map[string]int64{"a": 7}},
		{
			name: "floor only, highest outcome wins",
			raise: []struct {
				key string
				seq int64
			}{{"a", 5}, {"a", 9}, {"a", 3}},
			want:     map[string]int64{"a": 9},
			notified: map[string]int64{},
		},
		{
			name: "held above the floor",
			raise: []struct {
				key string
				seq int64
			}{{"a", 5}},
			held:     map[string]int64{"a": 12},
			want:     map[string]int64{"a": 12},
			notified: map[string]int64{"a": 12},
		},
		{
			name: "floor above what is held", // a lane refilled below a recorded outcome cannot happen, but the higher bound holds either way
			raise: []struct {
				key string
				seq int64
			}{{"a", 20}},
			held:     map[string]int64{"a": 12},
			want:     map[string]int64{"a": 20},
			notified: map[string]int64{"a": 20},
		},
		{
			name: "messages without a key have no floor",
			raise: []struct {
				key string
				seq int64
			}{{"", 4}, {"b", 2}},
			held:     map[string]int64{"c": 1},
			want:     map[string]int64{"b": 2, "c": 1},
			notified: map[string]int64{"c": 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFloors(10)
			for _, r := range tc.raise {
				f.raise(r.key, r.seq)
			}
			if got := bounds(f, tc.held, true); !maps.Equal(got, tc.want) {
				t.Fatalf("backlog: got %v, want %v", got, tc.want)
			}
			if got := bounds(f, tc.held, false); !maps.Equal(got, tc.notified) {
				t.Fatalf("notified: got %v, want %v", got, tc.notified)
			}
		})
	}
}

// A full set of floors forgets keys rather than grow; raising a remembered key never
// evicts another.
func TestFloorsBounded(t *testing.T) {
	f := newFloors(3)
	for i, k := range []string{"a", "b", "c"} {
		f.raise(k, int64(i+1))
	}
	f.raise("a", 10)
	if len(f.seq) != 3 || f.seq["a"] != 10 {
		t.Fatalf("raising a remembered key: %v", f.seq)
	}
	f.raise("d", 4)
	if len(f.seq) != 3 || f.seq["d"] != 4 {
		t.Fatalf("a new key in a full set: %v", f.seq)
	}
}
