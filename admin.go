package outbox

import "time"

// Status is a snapshot of an outbox, for `outbox status` and dashboards.
type Status struct {
	Pending          int64         `json:"pending"`            // not yet published, not dead
	Due              int64         `json:"due"`                // pending and due now
	Retrying         int64         `json:"retrying"`           // pending after at least one rejected attempt
	Delayed          int64         `json:"delayed"`            // pending and not due yet (backoff or DeliverAt)
	Dead             int64         `json:"dead"`               // dead-lettered
	Published        int64         `json:"published"`          // published and still kept (retention)
	OldestPendingAge time.Duration `json:"oldest_pending_age"` // age of the oldest pending message, in database time
	Topics           []TopicStatus `json:"topics"`
	Relays           []RelayInfo   `json:"relays"`
	Shards           int           `json:"shards"`
	ShardsLeased     int           `json:"shards_leased"` // shards with an unexpired lease
}

// TopicStatus is Status for one topic.
type TopicStatus struct {
	Topic            string        `json:"topic"`
	Pending          int64         `json:"pending"`
	Due              int64         `json:"due"`
	Retrying         int64         `json:"retrying"`
	Dead             int64         `json:"dead"`
	OldestPendingAge time.Duration `json:"oldest_pending_age"`
}

// RelayInfo describes a relay seen by the store.
type RelayInfo struct {
	ID          string    `json:"id"`
	Hostname    string    `json:"hostname"`
	PID         int       `json:"pid"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Live        bool      `json:"live"`
	Shards      int       `json:"shards"`
}

// DeadFilter selects dead letters. Zero fields match everything; set fields must all
// match.
type DeadFilter struct {
	IDs           []ID
	Topic         string
	Key           string
	ErrorContains string    // substring of the last error, case-insensitive
	Since, Until  time.Time // dead-lettered at or after Since, before Until
	Limit         int       // at most this many (list, replay, purge); 0 means no limit
}

// DeadLetter is a dead-lettered message with why it died.
type DeadLetter struct {
	Message
	DeadAt time.Time `json:"dead_at"`
}
