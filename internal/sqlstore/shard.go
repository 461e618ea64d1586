package sqlstore

import (
	"crypto/md5"
	"encoding/binary"

	"github.com/outboxkit/outbox"
)

// Shard returns the lease shard of a message: the first four bytes of md5(key), or of
// the id's text when the key is empty, read as a big-endian integer and masked to
// Shards. It is the value PostgreSQL's generated column computes (internal/pgsql's
// migration), so a key lands on the same shard whichever database holds the outbox.
// SQLite has no md5 and MySQL's is text, so the stores compute it here, at insert.
func Shard(key string, id outbox.ID) int {
	s := key
	if s == "" {
		s = id.String()
	}
	sum := md5.Sum([]byte(s))
	return int(binary.BigEndian.Uint32(sum[:4]) & (Shards - 1))
}
