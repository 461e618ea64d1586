package pgsql

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
)

func TestParseSnapshot(t *testing.T) {
	const epoch = uint64(7) << 32
	for _, tc := range []struct {
		in   string
		want outboxdriver.Snapshot
	}{
		{"10:20:12,15", outboxdriver.Snapshot{Xmin: 10, Xmax: 20, Xip: []uint64{12, 15}}},
		{"10:10:", outboxdriver.Snapshot{Xmin: 10, Xmax: 10}},
		{"10:20:", outboxdriver.Snapshot{Xmin: 10, Xmax: 20}},
		{"10:20:10", outboxdriver.Snapshot{Xmin: 10, Xmax: 20, Xip: []uint64{10}}},
		{fmt.Sprintf("%d:%d:%d", epoch-5, epoch+3, epoch-1), // an epoch boundary inside
			outboxdriver.Snapshot{Xmin: epoch - 5, Xmax: epoch + 3, Xip: []uint64{epoch - 1}}},
	} {
		got, err := ParseSnapshot(tc.in)
		if err != nil {
			t.Errorf("ParseSnapshot(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseSnapshot(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	for _, in := range []string{
		"", "10", "10:20", "a:20:", "10:b:", "20:10:", // shape, numbers, xmin above xmax
		"10:20:12,", "10:20:,12", "10:20:x", "-1:20:", // the xip list
		"10:20:9", "10:20:20", // an xip outside [xmin, xmax)
		"18446744073709551616:18446744073709551616:", // above 64 bits
	} {
		if s, err := ParseSnapshot(in); err == nil {
			t.Errorf("ParseSnapshot(%q) = %+v, want an error", in, s)
		}
	}
}

// FuzzParseSnapshot: whatever it accepts satisfies what Snapshot.Finished relies on and
// prints back as PostgreSQL would print it.
func FuzzParseSnapshot(f *testing.F) {
	for _, s := range []string{"10:20:12,15", "10:10:", "1:2:", "4294967290:4294967300:4294967295", "::", "1:2:3,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSnapshot(in)
		if err != nil {
			return
		}
		if s.Xmin > s.Xmax {
			t.Fatalf("%q: xmin %d above xmax %d", in, s.Xmin, s.Xmax)
		}
		xips := make([]string, len(s.Xip))
		for i, x := range s.Xip {
			if x < s.Xmin || x >= s.Xmax {
				t.Fatalf("%q: xip %d outside [%d, %d)", in, x, s.Xmin, s.Xmax)
			}
			xips[i] = fmt.Sprint(x)
		}
		if out := fmt.Sprintf("%d:%d:%s", s.Xmin, s.Xmax, strings.Join(xips, ",")); out != in {
			// Leading zeros or a plus sign parse too; PostgreSQL prints neither.
			if t2, err := ParseSnapshot(out); err != nil || !reflect.DeepEqual(t2, s) {
				t.Fatalf("%q parsed as %+v, which prints as %q and parses back as %+v, %v", in, s, out, t2, err)
			}
		}
	})
}
