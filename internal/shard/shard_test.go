package shard

import (
	"testing"

	"github.com/outboxkit/outbox/outboxtype"
)

// TestShardMatchesPostgreSQL checks Of against values PostgreSQL's generated column
// computed ((('x' || substr(md5(k), 1, 8))::bit(32)::int & 63), internal/pgsql's
// migration), so that a key lands on the same shard in every store.
func TestShardMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	id, err := outboxtype.ParseID("0190f1a2-7b3c-7def-8abc-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"a", 57},
		{"order-42", 12},
		{"k0", 59},
		{"k1", 58},
		{"Ünïcødé key", 20},
		{"", 51}, // no key: the id's text, as PostgreSQL's id::text
	} {
		if got := Of(tc.key, id); got != tc.want {
			t.Errorf("Of(%q) = %d, PostgreSQL says %d", tc.key, got, tc.want)
		}
	}
}
