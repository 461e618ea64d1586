package outboxtype

import (
	"testing"
	"time"
)

func TestNewIDMonotonicAndVersion7(t *testing.T) {
	t.Parallel()
	start := time.Now().Truncate(time.Millisecond) // an id's time has millisecond precision
	prev := NewID()
	for i := 0; i < 100_000; i++ {
		id := NewID()
		if string(id[:]) <= string(prev[:]) {
			t.Fatalf("ids not increasing: %s after %s", id, prev)
		}
		if id[6]>>4 != 7 || id[8]>>6 != 2 {
			t.Fatalf("%s is not a version 7, RFC 9562 variant UUID", id)
		}
		prev = id
	}
	// The last id's time lies between the first call and now (a second ahead allowed),
	// however long the loop took.
	if got := prev.Time(); got.Before(start) || got.After(time.Now().Add(time.Second)) {
		t.Fatalf("id time %v is not between %v and now", got, start)
	}
}

func TestParseIDRoundTrip(t *testing.T) {
	t.Parallel()
	id := NewID()
	got, err := ParseID(id.String())
	if err != nil || got != id {
		t.Fatalf("ParseID(%s) = %s, %v", id, got, err)
	}
	for _, bad := range []string{"", "nope", "0190d8f0-0000-7000-8000-00000000000", "0190d8f0x0000-7000-8000-000000000000", "0190d8f0-0000-7000-8000-00000000000g"} {
		if _, err := ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) accepted", bad)
		}
	}
}

func FuzzParseID(f *testing.F) {
	f.Add("0190d8f0-1234-7abc-8def-0123456789ab")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			return
		}
		again, err := ParseID(id.String())
		if err != nil || again != id {
			t.Fatalf("round trip of %q failed", s)
		}
	})
}
