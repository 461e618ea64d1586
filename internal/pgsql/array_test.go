package pgsql_test

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "github.com/lib/pq"              // driver "postgres"

	"github.com/outboxkit/outbox/internal/pgsql"
	"github.com/outboxkit/outbox/internal/testinfra/testdb"
)

func TestArrayLiterals(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{pgsql.IntArray([]int64(nil)), "{}"},
		{pgsql.IntArray([]int{3, -1, 0}), "{3,-1,0}"},
		{pgsql.IntArray([]int16{63}), "{63}"},
		{pgsql.TextArray(nil), "{}"},
		{pgsql.TextArray([]string{""}), `{""}`},
		{pgsql.TextArray([]string{"a", `b"c`, `d\e`, "NULL", "{x, y}"}), `{"a","b\"c","d\\e","NULL","{x, y}"}`},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
}

// textSeeds are strings a naive array literal would misread.
var textSeeds = []string{
	"", " ", "  padded  ", "NULL", "null", `"`, `\`, `\\"`, `""`, "{", "}", "{}", "{a,b}", ",", "a,b",
	"'quoted'", "tab\tnew\nline\r", "é ñ 日本 🎉", `ARRAY[1]`, "x\u00a0y", `\N`, "$1", "--", "/*",
}

// roundTrippers send a literal as a string parameter through every client the drivers
// use, pgx's own protocol included (outboxpgx passes dead-letter ids this way), and read
// the array's elements back in order.
func roundTrippers(tb testing.TB) map[string]func(cast, literal string) ([]string, error) {
	tb.Helper()
	pool := testdb.Pool(tb)
	out := map[string]func(cast, literal string) ([]string, error){}
	query := func(cast string) string {
		return `SELECT e::text FROM unnest($1::` + cast + `) WITH ORDINALITY AS u(e, i) ORDER BY i`
	}
	out["pgx"] = func(cast, literal string) ([]string, error) {
		rows, err := pool.Query(context.Background(), query(cast), literal)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		return textColumn(rows)
	}
	for _, name := range []string{"pgx", "postgres"} {
		db, err := sql.Open(name, testdb.URL())
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = db.Close() })
		out["database/sql "+name] = func(cast, literal string) ([]string, error) {
			rows, err := db.Query(query(cast), literal)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			return textColumn(rows)
		}
	}
	return out
}

// textColumn reads every row of a one-column result as text: pgx's rows and
// database/sql's both have these methods.
func textColumn(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}) ([]string, error) {
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		got = append(got, s)
	}
	return got, rows.Err()
}

func TestArrayLiteralsRoundTrip(t *testing.T) {
	t.Parallel()
	for name, rt := range roundTrippers(t) {
		check := func(cast, literal string, want []string) {
			t.Helper()
			got, err := rt(cast, literal)
			if err != nil {
				t.Fatalf("%s: %s %s: %v", name, cast, literal, err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: %s %s read back %q, want %q", name, cast, literal, got, want)
			}
		}
		check("text[]", pgsql.TextArray(textSeeds), textSeeds)
		check("text[]", pgsql.TextArray(nil), nil)
		check("bigint[]", pgsql.IntArray([]int64{-9223372036854775808, 0, 9223372036854775807}),
			[]string{"-9223372036854775808", "0", "9223372036854775807"})
		check("smallint[]", pgsql.IntArray([]int{0, 63}), []string{"0", "63"})
		check("uuid[]", pgsql.TextArray([]string{"0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b"}), []string{"0190a5b2-7c3e-7d4f-8a1b-2c3d4e5f6a7b"})
	}
}

// FuzzTextArray: any text PostgreSQL can hold comes back element for element, through
// every client.
func FuzzTextArray(f *testing.F) {
	for _, s := range textSeeds {
		f.Add(s, "b")
	}
	rts := roundTrippers(f)
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) || strings.ContainsRune(a+b, 0) {
			return // not text PostgreSQL can store; the drivers' callers strip or reject it
		}
		want := []string{a, b}
		for name, rt := range rts {
			got, err := rt("text[]", pgsql.TextArray(want))
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("%s: %q read back as %q, %v", name, want, got, err)
			}
		}
	})
}
