package pgsql

import (
	"strings"
	"testing"
)

// The stream reader recognizes the outbox by the names a Relation message carries:
// unquoted, the prefix in the table's name.
func TestOutboxRelation(t *testing.T) {
	for _, tc := range []struct{ schema, prefix, wantSchema, wantTable string }{
		{"", "", "public", "outbox"},
		{"billing", "app_", "billing", "app_outbox"},
	} {
		n, err := NewNames(Config{Schema: tc.schema, Prefix: tc.prefix})
		if err != nil {
			t.Fatal(err)
		}
		if s, tb := n.OutboxRelation(); s != tc.wantSchema || tb != tc.wantTable {
			t.Errorf("schema %q prefix %q: %s.%s, want %s.%s", tc.schema, tc.prefix, s, tb, tc.wantSchema, tc.wantTable)
		}
	}
}

// NextDue reads the partitioned parent (every bucket of the ring) with the "waiting"
// index's predicate, so that the partial index serves it.
func TestNextDueSQL(t *testing.T) {
	n, err := NewNames(Config{Schema: "s", Prefix: "p_"})
	if err != nil {
		t.Fatal(err)
	}
	got := n.NextDue()
	for _, want := range []string{`FROM "s"."p_outbox"`, `next_attempt_at > created_at AND next_attempt_at > now()`, `shard = ANY($1::smallint[])`} {
		if !strings.Contains(got, want) {
			t.Errorf("NextDue lacks %s:\n%s", want, got)
		}
	}
}
