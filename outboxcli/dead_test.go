package outboxcli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
)

// deadBundle is a migrated schema with three dead letters and one pending message whose
// error matches the filters, so that a filter reaching live rows shows.
type deadBundle struct {
	*testBundle
	old, mid, recent, pending outbox.Message
}

func newDeadBundle(t *testing.T) *deadBundle {
	t.Helper()
	b := &deadBundle{testBundle: migrated(t)}
	msg := func(topic, key string) outbox.Message {
		return outbox.Message{ID: outbox.NewID(), Topic: topic, Key: key, EventType: topic + ".event", Payload: []byte(`{"n":1}`)}
	}
	b.old, b.mid, b.recent, b.pending = msg("orders", "k1"), msg("orders", "k2"), msg("billing", "k1"), msg("orders", "k3")
	b.old.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	b.recent.Payload = []byte{0xff, 0x00, 0xfe}
	b.Write(t, b.old, b.mid, b.recent, b.pending)
	kill := func(m outbox.Message, lastError string, ago time.Duration) { b.Kill(t, m.ID, 10, lastError, ago) }
	kill(b.old, "nats: maximum payload exceeded\nsecond line", 3*time.Hour)
	kill(b.mid, "publish timeout", time.Hour)
	kill(b.recent, "schema mismatch", 10*time.Minute)
	b.Exec(t, `UPDATE %[1]s.outbox SET attempts = 2, last_error = 'publish timeout' WHERE id = $1`, b.pending.ID.String())
	return b
}

func listedIDs(t *testing.T, r result) []outbox.ID {
	t.Helper()
	var dls []deadLetterJSON
	if err := json.Unmarshal([]byte(r.stdout), &dls); err != nil {
		t.Fatalf("dead list --json: %v\n%s", err, r)
	}
	ids := make([]outbox.ID, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	return ids
}

func TestDeadListFilters(t *testing.T) {
	t.Parallel()
	b := newDeadBundle(t)
	cases := []struct {
		args []string
		env  map[string]string
		want []outbox.ID
	}{
		{nil, nil, []outbox.ID{b.recent.ID, b.mid.ID, b.old.ID}},
		{[]string{"--topic", "orders"}, nil, []outbox.ID{b.mid.ID, b.old.ID}},
		{[]string{"--key", "k1"}, nil, []outbox.ID{b.recent.ID, b.old.ID}},
		{[]string{"--error", "TIMEOUT"}, nil, []outbox.ID{b.mid.ID}},
		{[]string{"--since", "2h"}, nil, []outbox.ID{b.recent.ID, b.mid.ID}},
		{[]string{"--until", "2h"}, nil, []outbox.ID{b.old.ID}},
		{[]string{"--since", time.Now().Add(-2 * time.Hour).Format(time.RFC3339), "--until", "30m"}, nil, []outbox.ID{b.mid.ID}},
		{[]string{"--id", b.old.ID.String(), "--id", b.pending.ID.String(), "--id", b.recent.ID.String()}, nil, []outbox.ID{b.recent.ID, b.old.ID}},
		{nil, map[string]string{"OUTBOX_ID": b.old.ID.String() + "," + b.mid.ID.String()}, []outbox.ID{b.mid.ID, b.old.ID}},
		{[]string{"--limit", "1"}, nil, []outbox.ID{b.recent.ID}},
		{[]string{"--topic", "nope"}, nil, []outbox.ID{}},
	}
	for _, tc := range cases {
		args := append([]string{"dead", "list", "--json"}, tc.args...)
		r := must(t, 0, with(b.env, flatten(tc.env)...), args...)
		if got := listedIDs(t, r); !slices.Equal(got, tc.want) {
			t.Errorf("%v %v: got %v, want %v", tc.args, tc.env, got, tc.want)
		}
	}

	// The text table: one line per dead letter, the error cut to its first line.
	r := must(t, 0, b.env, "dead", "list", "--topic", "orders")
	for _, want := range []string{"DEAD AT", b.mid.ID.String(), b.old.ID.String(), "publish timeout", "nats: maximum payload exceeded ..."} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dead list: %q missing:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "second line") || strings.Contains(r.stdout, b.pending.ID.String()) {
		t.Errorf("dead list shows too much:\n%s", r.stdout)
	}
	if r := must(t, 0, b.env, "dead", "list", "--limit", "2"); !strings.Contains(r.stdout, "--limit 0 shows all") {
		t.Errorf("a full page does not say there may be more:\n%s", r.stdout)
	}
	if r := must(t, 0, b.env, "dead", "list", "--topic", "nope"); !strings.Contains(r.stdout, `no dead letters match topic="nope"`) {
		t.Errorf("empty list:\n%s", r.stdout)
	}
}

func flatten(m map[string]string) []string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k, v)
	}
	return kv
}

func TestDeadShow(t *testing.T) {
	t.Parallel()
	b := newDeadBundle(t)
	r := must(t, 0, b.env, "dead", "show", b.old.ID.String())
	for _, want := range []string{
		b.old.ID.String(), "orders", "k1", "orders.event", "attempts", "10",
		"nats: maximum payload exceeded\n  second line", "traceparent: 00-0af7651916cd43dd8448eb211c80319c",
		"payload (7 bytes, text):\n  {\"n\":1}",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dead show: %q missing:\n%s", want, r.stdout)
		}
	}
	// A payload that is not UTF-8 is shown in base64; flags may follow the id.
	r = must(t, 0, b.env, "dead", "show", b.recent.ID.String(), "--schema", b.Schema)
	if !strings.Contains(r.stdout, "payload (3 bytes, base64):\n  "+base64.StdEncoding.EncodeToString(b.recent.Payload)) {
		t.Errorf("binary payload:\n%s", r.stdout)
	}
	r = must(t, 0, b.env, "dead", "show", "--json", b.mid.ID.String())
	var dl deadLetterJSON
	if err := json.Unmarshal([]byte(r.stdout), &dl); err != nil || dl.ID != b.mid.ID || dl.LastError != "publish timeout" ||
		dl.DeadAt.IsZero() || string(dl.Payload) != `{"n":1}` || dl.Topic != "orders" || dl.Attempts != 10 {
		t.Errorf("dead show --json: %+v, %v", dl, err)
	}
	for _, key := range []string{`"id":`, `"dedup_key":`, `"dead_at":`, `"last_error":`, `"headers": {}`} {
		if !strings.Contains(r.stdout, key) {
			t.Errorf("dead show --json lacks %s:\n%s", key, r.stdout)
		}
	}
	// A pending message is not a dead letter.
	r = must(t, 1, b.env, "dead", "show", b.pending.ID.String())
	if !strings.Contains(r.stderr, "no dead letter has id") {
		t.Errorf("show of a pending message: %s", r)
	}
}

func TestDeadReplay(t *testing.T) {
	t.Parallel()
	b := newDeadBundle(t)
	dead := func() int { return b.CountIn(t, "outbox_dead", "true") }

	// Without --yes: says what it would do, exits 2, changes nothing.
	r := must(t, 2, b.env, "dead", "replay", "--topic", "orders")
	if !strings.Contains(r.stdout, `would replay 2 dead letters matching topic="orders"`) || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("replay without --yes: %s", r)
	}
	// --dry-run lists them and exits 0, changing nothing.
	r = must(t, 0, b.env, "dead", "replay", "--topic", "orders", "--dry-run")
	if !strings.Contains(r.stdout, b.mid.ID.String()) || !strings.Contains(r.stdout, b.old.ID.String()) || strings.Contains(r.stdout, b.recent.ID.String()) {
		t.Fatalf("replay --dry-run: %s", r)
	}
	if dead() != 3 {
		t.Fatal("replay changed rows without --yes")
	}

	r = must(t, 0, b.env, "dead", "replay", "--topic", "orders", "--error", "timeout", "--yes")
	if !strings.Contains(r.stdout, `replayed 1 dead letter matching topic="orders" error~"timeout"`) {
		t.Fatalf("replay --yes: %s", r)
	}
	where := fmt.Sprintf("id = '%s' AND attempts = 0 AND dedup_key = '%s'", b.mid.ID, b.mid.ID)
	if dead() != 2 || b.count(t, where) != 1 || b.CountAll(t, fmt.Sprintf("id = '%s'", b.mid.ID)) != 1 {
		t.Fatal("replay did not move exactly the match back to pending with the same id and dedup key")
	}
	if r := must(t, 0, b.env, "dead", "replay", "--topic", "nope", "--yes"); !strings.Contains(r.stdout, "nothing to replay") {
		t.Fatalf("replay of nothing: %s", r)
	}
}

func TestDeadPurge(t *testing.T) {
	t.Parallel()
	b := newDeadBundle(t)
	total := func() int { return b.CountAll(t, "true") }

	for _, args := range [][]string{
		{"dead", "purge", "--yes"},                          // no filter
		{"dead", "purge", "--all", "--topic", "x", "--yes"}, // --all with a filter
		{"dead", "purge", "--key", "k1"},                    // no --yes
		{"dead", "purge", "--all"},                          // no --yes
		{"dead", "purge", "--all", "--limit", "1", "--yes"}, // --all with a limit
		{"dead", "purge", "--error", "timeout", "--bogus"},  // bad flag
	} {
		must(t, 2, b.env, args...)
	}
	if total() != 4 {
		t.Fatal("a refused purge deleted rows")
	}

	r := must(t, 0, b.env, "dead", "purge", "--key", "k1", "--dry-run")
	if !strings.Contains(r.stdout, `would purge 2 dead letters matching key="k1"`) || total() != 4 {
		t.Fatalf("purge --dry-run: %s", r)
	}
	r = must(t, 0, b.env, "dead", "purge", "--key", "k1", "--limit", "1", "--yes")
	if !strings.Contains(r.stdout, `purged the newest dead letter matching key="k1"`) || b.CountAll(t, fmt.Sprintf("id = '%s'", b.recent.ID)) != 0 {
		t.Fatalf("purge --key --limit 1 did not delete the newest match: %s", r)
	}
	// The error filter also matches the pending message; it must survive.
	must(t, 0, b.env, "dead", "purge", "--error", "timeout", "--yes")
	if b.count(t, fmt.Sprintf("id = '%s'", b.pending.ID)) != 1 || b.CountAll(t, fmt.Sprintf("id = '%s'", b.mid.ID)) != 0 {
		t.Fatal("purge by error deleted the wrong rows")
	}
	r = must(t, 0, b.env, "dead", "purge", "--all", "--yes")
	if !strings.Contains(r.stdout, "purged the only dead letter") || total() != 1 || b.count(t, "true") != 1 {
		t.Fatalf("purge --all: %s", r)
	}
}

// TestDeadOutputEscapesControls: a payload or a broker's error can carry terminal escape
// sequences (clear screen, window title, OSC 52 clipboard); dead show and dead list print
// them as readable escapes, never raw.
func TestDeadOutputEscapesControls(t *testing.T) {
	t.Parallel()
	b := migrated(t)
	m := outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "k", Payload: []byte("before\x1b[2Jafter\n\x1b]0;owned\x07")}
	b.Write(t, m)
	b.Kill(t, m.ID, 1, "refused \x1b]52;c;c2VjcmV0\x07 and \u009b31m red", time.Minute)
	for _, args := range [][]string{{"dead", "show", m.ID.String()}, {"dead", "list"}} {
		r := must(t, 0, b.env, args...)
		if strings.ContainsAny(r.stdout, "\x1b\x07\u009b") {
			t.Errorf("outbox %s printed a raw control character:\n%q", strings.Join(args, " "), r.stdout)
		}
		if !strings.Contains(r.stdout, `refused \x1b]52;c;c2VjcmV0\a and \u009b31m red`) {
			t.Errorf("outbox %s: the last error is not shown escaped:\n%s", strings.Join(args, " "), r.stdout)
		}
	}
	if r := must(t, 0, b.env, "dead", "show", m.ID.String()); !strings.Contains(r.stdout, `before\x1b[2Jafter`+"\n  "+`\x1b]0;owned\a`) {
		t.Errorf("dead show: the payload is not shown escaped, line by line:\n%s", r.stdout)
	}
}

// TestDeadFilterInputErrors: a filter no message can match (NUL, invalid UTF-8) is a
// usage error, found before connecting.
func TestDeadFilterInputErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OUTBOX_DATABASE_URL": unreachableDB}
	for _, args := range [][]string{
		{"dead", "list", "--topic", "a\x00b"},
		{"dead", "list", "--key", "\xff"},
		{"dead", "purge", "--error", "\xc3", "--yes"},
	} {
		if r := must(t, 2, env, args...); !strings.Contains(r.stderr, "--") {
			t.Errorf("%v: %s", args, r)
		}
	}
}
