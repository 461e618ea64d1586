package outboxdriver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxtype"
)

func TestDeadFilterValidate(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		f     DeadFilter
		field string // "" when valid
	}{
		{DeadFilter{}, ""},
		{DeadFilter{Topic: "orders", Key: "k-ü", ErrorContains: "timeout", Limit: 5, Since: now.Add(-time.Hour), Until: now}, ""},
		{DeadFilter{Topic: "a\x00b"}, "DeadFilter.Topic"},
		{DeadFilter{Key: "\xff"}, "DeadFilter.Key"},
		{DeadFilter{ErrorContains: "\xc3"}, "DeadFilter.ErrorContains"},
		{DeadFilter{Limit: -1}, "DeadFilter.Limit"},
		{DeadFilter{Since: now, Until: now}, "DeadFilter.Since"},
	} {
		err := tc.f.Validate()
		var ce *outboxtype.ConfigError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v", tc.f, err)
		case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
			t.Errorf("%+v: %v, want a *outboxtype.ConfigError for %s", tc.f, err, tc.field)
		}
	}
}

func TestStatusWarnings(t *testing.T) {
	t.Parallel()
	beat := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		st   Status
		want []string // a part of each warning, in order
	}{
		{"quiet", Status{Pending: 3, Due: 3, ShardsLeased: 64, Shards: 64}, nil},
		{"nothing due, no relay", Status{Pending: 2, Delayed: 2, Shards: 64}, nil},
		{"due, no relay", Status{Pending: 4, Due: 4, Shards: 64}, []string{"4 messages are due and no relay holds a shard"}},
		{"dead relay and letters", Status{Dead: 2, ShardsLeased: 10, Relays: []RelayInfo{
			{ID: "a", Hostname: "h", PID: 7, HeartbeatAt: beat, Live: false}, {ID: "b", Live: true}}},
			[]string{"relay a (host h, pid 7) stopped heartbeating at 2026-01-02T03:04:05Z", "2 dead letters"}},
		{"one due, one dead", Status{Pending: 1, Due: 1, Dead: 1, Shards: 64},
			[]string{"1 message is due and no relay holds a shard", "1 dead letter waits for an operator"}},
		{"dead letters coming in", Status{Dead: 5, DeadLastHour: 3, ShardsLeased: 64},
			[]string{"3 messages were dead-lettered in the last hour (5 dead letters in all)"}},
		{"WAL", Status{ShardsLeased: 64, WAL: []WALSlotStatus{
			{Slot: "s1", State: "streaming", Exists: true},
			{Slot: "s2", State: "fallback", Reason: "wal_level is replica", Exists: true},
			{Slot: "s3", State: "streaming"}}},
			[]string{"s2: relays poll instead of reading it (wal_level is replica)", "WAL slot s3 is recorded but PostgreSQL has none"}},
	}
	for _, tt := range tests {
		got := tt.st.Warnings()
		ok := len(got) == len(tt.want)
		for i := 0; ok && i < len(got); i++ {
			ok = strings.Contains(got[i], tt.want[i])
		}
		if !ok {
			t.Errorf("%s: Warnings() = %q, want warnings containing %q", tt.name, got, tt.want)
		}
	}
}
