package sqlstore

import (
	"slices"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
)

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
