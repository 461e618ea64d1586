package outboxcli

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	due := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "a", Payload: []byte(`{}`)}
	delayed := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "b", Payload: []byte(`{}`), DeliverAt: time.Now().Add(time.Hour), Priority: 3}
	retrying := outbox.Message{ID: outbox.NewID(), Topic: "billing", Key: "c", Payload: []byte(`{}`)}
	dead := outbox.Message{ID: outbox.NewID(), Topic: "billing", Key: "d", Payload: []byte(`{}`)}
	published := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "e", Payload: []byte(`{}`)}
	b.Write(t, due, delayed, retrying, dead, published)
	b.Exec(t, `UPDATE %[1]s.outbox SET created_at = now() - interval '2 hours' WHERE id = $1`, due.ID.String())
	b.Exec(t, `UPDATE %[1]s.outbox SET attempts = 1, last_error = 'nack', next_attempt_at = now() + interval '1 minute' WHERE id = $1`, retrying.ID.String())
	b.Kill(t, dead.ID, 10, "nack", 0)
	b.MarkPublished(t, published.ID)
	b.Exec(t, `INSERT INTO %[1]s.outbox_relays (id, hostname, pid, expires_at) VALUES ('relay-a', 'host-a', 4242, now() + interval '1 minute')`)
	b.Exec(t, `UPDATE %[1]s.outbox_leases SET owner = 'relay-a', token = shard + 1, expires_at = now() + interval '1 minute' WHERE shard < 32`)

	st := statusJSON(t, b)
	if st.Pending != 3 || st.Due != 1 || st.Delayed != 2 || st.Retrying != 1 || st.Dead != 1 || st.Published != 1 ||
		st.Shards != 64 || st.ShardsLeased != 32 || len(st.Topics) != 2 || len(st.Relays) != 1 ||
		len(st.Priorities) != 2 || st.Priorities[0].Priority != 3 || st.Priorities[0].Pending != 1 || st.Priorities[1].Pending != 2 {
		t.Fatalf("status --json: %+v", st)
	}
	if st.OldestPendingAge < 2*time.Hour || st.OldestPendingAge > 2*time.Hour+time.Minute {
		t.Fatalf("oldest pending age %v, want about 2h", st.OldestPendingAge)
	}
	if r := st.Relays[0]; r.ID != "relay-a" || r.Hostname != "host-a" || r.PID != 4242 || !r.Live || r.Shards != 32 {
		t.Fatalf("relay: %+v", r)
	}

	r := must(t, 0, b.env, "status")
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^pending +3$`),
		regexp.MustCompile(`(?m)^  due +1$`),
		regexp.MustCompile(`(?m)^  delayed +2 `),
		regexp.MustCompile(`(?m)^  retrying +1 `),
		regexp.MustCompile(`(?m)^dead +1 \(1 in the last hour\)$`),
		regexp.MustCompile(`(?m)^published +1 `),
		regexp.MustCompile(`(?m)^oldest pending +2h0m\d+s$`),
		regexp.MustCompile(`(?m)^shards leased +32 of 64$`),
		regexp.MustCompile(`(?m)^TOPIC +PENDING +DUE +RETRYING +DEAD +OLDEST PENDING$`),
		regexp.MustCompile(`(?m)^billing +1 +0 +1 +1 +`),
		regexp.MustCompile(`(?m)^orders +2 +1 +0 +0 +2h`),
		regexp.MustCompile(`(?m)^PRIORITY +PENDING +DUE +OLDEST PENDING$`),
		regexp.MustCompile(`(?m)^3 +1 +0 +`),
		regexp.MustCompile(`(?m)^0 +2 +1 +2h`),
		regexp.MustCompile(`(?m)^relay-a +host-a +4242 +yes +32 `),
		regexp.MustCompile(`(?m)^WARNING: 1 message was dead-lettered in the last hour \(1 dead letter in all\)`),
	} {
		if !want.MatchString(r.stdout) {
			t.Errorf("status text does not match %s:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "no relay holds a shard") {
		t.Errorf("status warns of due messages without a relay while relay-a holds shards:\n%s", r.stdout)
	}
	// The relay dies: its row stays, not live, and no shard is leased any more.
	b.Exec(t, `UPDATE %[1]s.outbox_relays SET expires_at = now() - interval '1 second'`)
	b.Exec(t, `UPDATE %[1]s.outbox_leases SET expires_at = now() - interval '1 second'`)
	stopped := must(t, 0, b.env, "status")
	for _, want := range []string{
		"WARNING: 1 message is due and no relay holds a shard",
		"WARNING: relay relay-a (host host-a, pid 4242) stopped heartbeating",
	} {
		if !strings.Contains(stopped.stdout, want) {
			t.Errorf("status after the relay died does not say %q:\n%s", want, stopped.stdout)
		}
	}
	if strings.Contains(r.stdout, " \n") {
		t.Errorf("status text has trailing spaces:\n%q", r.stdout)
	}
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	id := outbox.NewID()
	for _, tc := range []struct {
		n    int
		f    outboxdriver.DeadFilter
		want string
	}{
		{3, outboxdriver.DeadFilter{}, "all 3 dead letters"},
		{1, outboxdriver.DeadFilter{}, "the only dead letter"},
		{5, outboxdriver.DeadFilter{Limit: 5}, "the newest 5 dead letters"},
		{2, outboxdriver.DeadFilter{Limit: 5}, "all 2 dead letters"},
		{1, outboxdriver.DeadFilter{Topic: "orders", Limit: 1}, `the newest dead letter matching topic="orders"`},
		{2, outboxdriver.DeadFilter{Topic: "orders", ErrorContains: "time out"}, `2 dead letters matching topic="orders" error~"time out"`},
		{1, outboxdriver.DeadFilter{IDs: []outbox.ID{id}}, "1 dead letter matching id=" + id.String()},
	} {
		if got := tc.f.Describe(tc.n); got != tc.want {
			t.Errorf("Describe(%d) of %+v = %q, want %q", tc.n, tc.f, got, tc.want)
		}
	}
}
