package sqlstore

import (
	"slices"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestShardMatchesPostgreSQL checks Shard against values PostgreSQL's generated column
// computed ((('x' || substr(md5(k), 1, 8))::bit(32)::int & 63), internal/pgsql's
// migration), so that a key lands on the same shard in every store.
func TestShardMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	id, err := outbox.ParseID("0190f1a2-7b3c-7def-8abc-0123456789ab")
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
		if got := Shard(tc.key, id); got != tc.want {
			t.Errorf("Shard(%q) = %d, PostgreSQL says %d", tc.key, got, tc.want)
		}
	}
}

func TestSplitStatements(t *testing.T) {
	t.Parallel()
	got := splitStatements(`-- a comment; with a semicolon
CREATE TABLE x (
    a int, -- trailing comments stay; SQL ignores them
    -- a comment line inside
    b int
);

INSERT INTO x VALUES (1, 2);
SELECT 1`)
	want := []string{
		"CREATE TABLE x (\n    a int, -- trailing comments stay; SQL ignores them\n    b int\n)",
		"INSERT INTO x VALUES (1, 2)",
		"SELECT 1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("splitStatements = %q, want %q", got, want)
	}
}

func TestLeaseMatch(t *testing.T) {
	t.Parallel()
	got := leaseMatch("l.", []outboxdriver.Lease{{Shard: 3, Token: 7}, {Shard: 10, Token: 1}})
	want := "l.shard IN (3,10) AND l.token = CASE l.shard WHEN 3 THEN 7 WHEN 10 THEN 1 END"
	if got != want {
		t.Fatalf("leaseMatch = %q, want %q", got, want)
	}
}

func FuzzValidatePrefix(f *testing.F) {
	for _, s := range []string{"", "billing_", "Bad", "x`y", `x"y`, "a b", "_", "9x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, prefix string) {
		if ValidatePrefix(prefix, 64) != nil {
			return
		}
		for _, r := range prefix {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
				t.Fatalf("prefix %q accepted with %q in it", prefix, r)
			}
		}
		if len(prefix)+len(longestSuffix) > 64 {
			t.Fatalf("prefix %q accepted: names built from it exceed 64 bytes", prefix)
		}
	})
}
