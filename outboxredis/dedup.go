package outboxredis

import "strings"

// dedupScript adds an entry unless the message's marker says it was added within the
// dedup window. KEYS[1] is the stream, KEYS[2] the marker; ARGV[1] is the window in
// milliseconds, ARGV[2:] the XADD arguments after the key. It returns the entry ID, the
// first copy's on a duplicate.
//
// On a duplicate the script still writes (it renews the marker's expiry): WAIT is
// documented to cover the writes of its own connection, and the first copy may have
// come through another one. (Redis 7.0 makes a connection that never wrote wait for
// every earlier write, but that is not a documented promise.)
const dedupScript = `local id = redis.call('GET', KEYS[2])
if id then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  return id
end
id = redis.call('XADD', KEYS[1], unpack(ARGV, 2))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id`

// DedupMarkerInfix separates the stream name from the dedup key in the name of a dedup
// marker (Config.DedupWindow): "{orders}:outbox-dedup:<dedup key>".
const DedupMarkerInfix = ":outbox-dedup:"

// dedupMarker names the marker of dedupKey in stream. One script touches both keys, so
// in a cluster they must hash to the same slot: the stream name becomes the marker's
// hash tag ("{orders}:outbox-dedup:k"), unless the name holds a "}", whose own hash tag
// (if any) the marker then shares by starting with the name.
func dedupMarker(stream, dedupKey string) string {
	if strings.IndexByte(stream, '}') >= 0 {
		return stream + DedupMarkerInfix + dedupKey
	}
	return "{" + stream + "}" + DedupMarkerInfix + dedupKey
}
