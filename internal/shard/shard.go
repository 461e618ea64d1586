// Package shard computes a message's lease shard, the same way on every store.
package shard

import (
	"crypto/md5"
	"encoding/binary"

	"github.com/outboxkit/outbox/outboxtype"
)

// Count is the number of lease shards. PostgreSQL computes a row's shard in a generated
// column (internal/pgsql's first migration), so changing it means a migration.
const Count = 64

// Of returns the lease shard of a message: the first four bytes of md5(key), or of the
// id's text when the key is empty, read as a big-endian integer and masked to Count. It
// is the value PostgreSQL's generated column computes, so a key lands on the same shard
// whichever database holds the outbox: SQLite has no md5 and MySQL's is text, so their
// stores compute it here at insert, and PostgreSQL's WAL reader computes it for the rows
// it decodes (the log does not carry generated columns).
func Of(key string, id outboxtype.ID) int {
	s := key
	if s == "" {
		s = id.String()
	}
	sum := md5.Sum([]byte(s))
	return int(binary.BigEndian.Uint32(sum[:4]) & (Count - 1))
}
