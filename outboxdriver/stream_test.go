package outboxdriver

import "testing"

func TestSnapshotFinished(t *testing.T) {
	const epoch = uint64(3) << 32
	s := Snapshot{Xmin: epoch + 100, Xmax: epoch + 200, Xip: []uint64{epoch + 150}}
	for _, c := range []struct {
		xid  uint32
		want bool
	}{
		{50, true},         // below xmin
		{100, true},        // xmin itself, not running
		{150, false},       // running
		{199, true},        // finished, just below xmax
		{200, false},       // xmax: not known finished (it may have started and still run)
		{250, false},       // above xmax: later still
		{0xFFFFFFF0, true}, // the previous epoch's, long finished
	} {
		if got := s.Finished(c.xid); got != c.want {
			t.Errorf("Finished(%d) = %v, want %v", c.xid, got, c.want)
		}
	}
	// Across the epoch boundary: xmax just past it, a transaction of the epoch before.
	s = Snapshot{Xmin: epoch - 10, Xmax: epoch + 5, Xip: []uint64{epoch - 3}}
	if !s.Finished(0xFFFFFFFF - 20) {
		t.Error("a transaction of the previous epoch below xmin: want finished")
	}
	if s.Finished(0xFFFFFFFF - 2) {
		t.Error("the previous epoch's running transaction: want not finished")
	}
	if !s.Finished(2) {
		t.Error("a finished transaction of xmax's epoch: want finished")
	}
	if s.Finished(5) || s.Finished(9) {
		t.Error("at or above xmax, across the epoch boundary: want not finished")
	}
	if (Snapshot{Xmin: 10, Xmax: 20}).Finished(30) {
		t.Error("xid above xmax in the first epoch: want not finished")
	}
}
