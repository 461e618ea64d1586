package outboxredis

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
)

// ErrNotReplicated is matched (errors.Is) by the outage of a message that the primary
// added but fewer than Config.WaitReplicas replicas acknowledged within
// Config.WaitTimeout.
var ErrNotReplicated = errors.New("outboxredis: not acknowledged by enough replicas")

// rejectedERR are the ERR replies that refuse one message on its merits. Every other
// ERR reply is an outage: proxies (Envoy, twemproxy) answer ERR for upstream failures,
// and a server without streams answers "ERR unknown command".
var rejectedERR = []string{
	"ERR The stream has exhausted the last possible ID", // the stream reached ID 2^64-1-2^64-1
	"ERR Protocol error", // a field over proto-max-bulk-len
	"ERR string exceeds maximum allowed size",
}

// classify turns an error of adding a message to stream into an outage or a rejection
// (see the package documentation).
func classify(err error, stream string) error {
	wrapped := fmt.Errorf("outboxredis: add to stream %q: %w", stream, err)
	if rejected(err) {
		return wrapped
	}
	return outbox.Outage(wrapped)
}

// rejected reports whether err is Redis refusing one message on its merits.
func rejected(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false // connection, timeout, ctx, closed client, ...
	}
	msg := rerr.Error()
	code, _, _ := strings.Cut(msg, " ")
	switch code {
	case "WRONGTYPE", // the stream's key holds another type (also when raised inside the dedup script)
		"CROSSSLOT": // a stream name whose dedup marker cannot share its cluster slot
		return true
	case "ERR":
		for _, prefix := range rejectedERR {
			if strings.HasPrefix(msg, prefix) {
				return true
			}
		}
	}
	// OOM, LOADING, BUSY, TRYAGAIN, MASTERDOWN, CLUSTERDOWN, READONLY, MOVED, ASK,
	// NOREPLICAS, MISCONF, NOAUTH, WRONGPASS, NOPERM, redis.Nil, codes not known yet.
	return false
}
