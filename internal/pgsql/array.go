package pgsql

import (
	"strconv"
	"strings"
)

// Array parameters. The statements take arrays as parameters cast in the SQL text
// ($3::bigint[], $5::text[]). pgx binds a Go slice to such a parameter natively, but
// database/sql drivers disagree on slices: pgx's stdlib takes them, lib/pq wants them
// wrapped in pq.Array, others refuse them. Every driver binds a string, though, and
// PostgreSQL parses a string on the cast as an array literal, so outboxsql passes the
// literals below and the SQL stays the same for every driver.

// IntArray renders v as a PostgreSQL array literal, "{1,2,3}", for a parameter cast to an
// integer array. An empty or nil v is "{}", an empty array, not NULL.
func IntArray[T ~int | ~int16 | ~int32 | ~int64](v []T) string {
	b := make([]byte, 0, 2+len(v)*8)
	b = append(b, '{')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return string(append(b, '}'))
}

// TextArray renders v as a PostgreSQL array literal for a parameter cast to text[] (or
// another type read from text, such as uuid[]). Every element is double-quoted with its
// backslashes and double quotes escaped, so that commas, braces, spaces, quotes and the
// word NULL are read as the text they are. An empty or nil v is "{}". The strings must
// not contain NUL, which no PostgreSQL text can hold.
func TextArray(v []string) string {
	var b strings.Builder
	n := 2
	for _, s := range v {
		n += len(s) + 3
	}
	b.Grow(n)
	b.WriteByte('{')
	for i, s := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
