package brokers

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
)

// TestOpenChecksBeforeConnecting: wrong settings fail Open with a *SettingError naming
// the setting, before anything connects (every URL here points at a closed port), and
// without the URL's credentials.
func TestOpenChecksBeforeConnecting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url     string
		options map[string][]string
		want    string
	}{
		{"gopher://x", nil, `--broker: unknown scheme "gopher"`},
		{"http://127.0.0.1:1/hooks", nil, "--webhook-secret: required"},
		{"nats://127.0.0.1:1", map[string][]string{"nats-stream-subjects": {"a.>"}}, "--nats-stream-subjects: only used with --nats-create-stream"},
		{"nats://127.0.0.1:1", map[string][]string{"rabbitmq-exchange": {"x"}}, `NATS JetStream has no setting "rabbitmq-exchange"`},
		{"amqp://127.0.0.1:1", map[string][]string{"rabbitmq-max-channels": {"1", "2"}}, "--rabbitmq-max-channels takes one value, not 2"},
		{"amqp://127.0.0.1:1", map[string][]string{"rabbitmq-max-channels": {"0"}}, "--rabbitmq-max-channels: must be positive"},
		{"kafka://u:" + canary + "@127.0.0.1:1", nil, "--broker: kafka:// URL: credentials do not go in the URL"},
		{"redis://127.0.0.1:1", map[string][]string{"redis-password": {"a"}, "redis-password-file": {"b"}}, "give one"},
		{"sqs://?region=eu-west-1", map[string][]string{"sqs-endpoint": {"127.0.0.1:4566"}}, "--sqs-endpoint"},
	} {
		_, err := Open(context.Background(), tc.url, Settings{Options: tc.options})
		var se *SettingError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), canary) {
			t.Errorf("Open(%s, %v): %v, want a *SettingError with %q", tc.url, tc.options, err, tc.want)
		}
	}
}

type recordedSecrets struct{ opaque, urls []string }

func (r *recordedSecrets) Opaque(_, value string) { r.opaque = append(r.opaque, value) }
func (r *recordedSecrets) URL(u string)           { r.urls = append(r.urls, u) }

// TestOpenRegistersSecrets: a secret given as a setting, and a URL a password was put
// into, reach Settings.Secrets before Open connects, so that the connection's errors
// can be scrubbed.
func TestOpenRegistersSecrets(t *testing.T) {
	t.Parallel()
	var rec recordedSecrets
	_, err := Open(context.Background(), "http://127.0.0.1:1/hooks", Settings{Secrets: &rec,
		Options: map[string][]string{"webhook-secret": {"s1-" + canary, "s2-" + canary}}})
	if err == nil {
		t.Fatal("a webhook receiver on a closed port opened")
	}
	if !slices.Contains(rec.opaque, "s1-"+canary) || !slices.Contains(rec.opaque, "s2-"+canary) {
		t.Errorf("secrets registered: %v", rec.opaque)
	}
	rec = recordedSecrets{}
	_, err = Open(context.Background(), "amqp://app@127.0.0.1:1/", Settings{Secrets: &rec,
		Options: map[string][]string{"rabbitmq-password": {canary}}})
	if err == nil || len(rec.urls) != 1 || !strings.Contains(rec.urls[0], "app:"+canary+"@") {
		t.Errorf("err %v, URLs registered: %v", err, rec.urls)
	}
}

// TestOpenRedis opens a publisher from a URL and settings alone, as a relay with
// several destinations does, and publishes through it.
func TestOpenRedis(t *testing.T) {
	t.Parallel()
	addr := cmp.Or(os.Getenv("OUTBOX_TEST_REDIS_ADDR"), "127.0.0.1:6379")
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	stream := "brokers-test-" + hex.EncodeToString(b)
	ctx := context.Background()
	opened, err := Open(ctx, "redis://"+addr, Settings{Route: stream, Options: map[string][]string{"redis-maxlen": {"10"}}})
	if err != nil {
		t.Fatalf("Redis is needed (start redis-server, or set OUTBOX_TEST_REDIS_ADDR): %v", err)
	}
	defer opened.Close()
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	defer client.Del(ctx, stream)
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "o-1", Payload: []byte(`{}`)}
	if errs := opened.Publisher.Publish(ctx, []*outbox.Message{msg}); errs != nil {
		t.Fatal(errs[0])
	}
	if n, err := client.XLen(ctx, stream).Result(); n != 1 || err != nil {
		t.Errorf("stream %s holds %d entries (%v), want 1", stream, n, err)
	}
}

// TestEveryBrokerIsComplete: each registered broker has what help, errors and metrics
// show, and a scheme no other broker serves.
func TestEveryBrokerIsComplete(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, b := range All() {
		if b.Name == "" || b.Label == "" || b.Example == "" || len(b.Schemes) == 0 {
			t.Errorf("%+v lacks a name, label, example or scheme", b)
		}
		if got, err := ForURL(b.Example); got != b || err != nil {
			t.Errorf("ForURL(%s) = %v, %v; want %s", b.Example, got, err, b.Name)
		}
		for _, s := range b.Schemes {
			if other, ok := seen[s]; ok {
				t.Errorf("scheme %s is served by %s and %s", s, other, b.Name)
			}
			seen[s] = b.Name
		}
	}
}
