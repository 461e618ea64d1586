package pgsql

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
)

var plain = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// FuzzNames: whatever a configuration says, an accepted schema and prefix are plain
// lower-case identifiers that fit PostgreSQL's 63 bytes in every name built from them,
// every rendered statement quotes them, and a rejected one is a *ConfigError.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"public", "", "billing", `x"; DROP TABLE y; --`, "Upper", "a b", "p\x00", strings.Repeat("s", 70)} {
		f.Add(s, "")
		f.Add("public", s)
	}
	f.Fuzz(func(t *testing.T, schema, prefix string) {
		n, err := NewNames(Config{Schema: schema, Prefix: prefix})
		if err != nil {
			if !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Fatalf("rejection is not a ConfigError: %v", err)
			}
			return
		}
		if schema != "" && (!plain.MatchString(schema) || len(schema) > 63) {
			t.Fatalf("accepted schema %q", schema)
		}
		if prefix != "" && (!plain.MatchString(prefix) || len(prefix)+len(longestSuffix) > 63) {
			t.Fatalf("accepted prefix %q", prefix)
		}
		for _, q := range []string{n.Outbox, n.Published, n.Dead, n.Dedup, n.Leases, n.Relays, n.Migrations, n.Index("dedup_created")} {
			for _, part := range strings.Split(q, ".") {
				if len(part) < 2 || part[0] != '"' || part[len(part)-1] != '"' || strings.Count(part, `"`) != 2 || len(part)-2 > 63 {
					t.Fatalf("badly quoted name %s", q)
				}
			}
		}
		migs, err := n.AllMigrations()
		if err != nil || len(migs) == 0 {
			t.Fatalf("migrations: %v", err)
		}
	})
}

func TestMigrationsRender(t *testing.T) {
	n, err := NewNames(Config{Schema: "s", Prefix: "p_"})
	if err != nil {
		t.Fatal(err)
	}
	migs, err := n.AllMigrations()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if strings.Contains(m.Up, "{{") || strings.Contains(m.Down, "{{") || m.Down == "" {
			t.Fatalf("migration %d not fully rendered", m.Version)
		}
		if !strings.Contains(m.Up, `"s"."p_outbox`) {
			t.Fatalf("migration %d does not use the configured names", m.Version)
		}
	}
}
