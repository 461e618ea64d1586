package outboxtype

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ID is a message identifier: a UUID, by default version 7 (time-ordered), so that ids
// sort roughly by creation time and index well. The zero ID means "generate one".
type ID [16]byte

// NewID returns a new UUIDv7. Within one process the ids it returns are strictly
// increasing, even when the clock stands still or steps back, because the 12 bits after
// the millisecond timestamp carry a counter (RFC 9562, method 1). It is safe for
// concurrent use.
func NewID() ID {
	idGen.mu.Lock()
	ms := uint64(time.Now().UnixMilli())
	if ms <= idGen.lastMS {
		idGen.seq++
		if idGen.seq > 0xfff { // counter exhausted: borrow the next millisecond
			idGen.lastMS++
			idGen.seq = 0
		}
		ms = idGen.lastMS
	} else {
		idGen.lastMS = ms
		idGen.seq = 0
	}
	seq := idGen.seq
	idGen.mu.Unlock()

	var id ID
	binary.BigEndian.PutUint64(id[0:8], ms<<16)
	id[6] = 0x70 | byte(seq>>8)
	id[7] = byte(seq)
	if _, err := rand.Read(id[8:]); err != nil {
		panic("outbox: crypto/rand failed: " + err.Error())
	}
	id[8] = 0x80 | id[8]&0x3f // RFC 9562 variant
	return id
}

var idGen struct {
	mu     sync.Mutex
	lastMS uint64
	seq    uint16
}

// IsZero reports whether id is the zero ID.
func (id ID) IsZero() bool { return id == ID{} }

// Time returns the creation time encoded in a version 7 ID, or the zero time for other
// versions.
func (id ID) Time() time.Time {
	if id[6]>>4 != 7 {
		return time.Time{}
	}
	ms := binary.BigEndian.Uint64(id[0:8]) >> 16
	return time.UnixMilli(int64(ms))
}

// String returns the canonical 36-character form.
func (id ID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}

// MarshalText implements encoding.TextMarshaler.
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *ID) UnmarshalText(b []byte) error {
	p, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = p
	return nil
}

// ErrInvalidID is returned by ParseID for text that is not a UUID.
var ErrInvalidID = errors.New("outbox: invalid id")

// ParseID parses the canonical 36-character UUID form (hyphens required, any case).
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, fmt.Errorf("%w: %q: want the 36-character form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", ErrInvalidID, s)
	}
	src := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if _, err := hex.Decode(id[:], []byte(src)); err != nil {
		return ID{}, fmt.Errorf("%w: %q: %v", ErrInvalidID, s, err)
	}
	return id, nil
}
