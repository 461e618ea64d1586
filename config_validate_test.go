package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxamqp"
	"github.com/outboxkit/outbox/outboxkafka"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxnats"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// TestConfigValidate: every config type has a Validate that needs no connection and
// names the field at fault, so that a command line or a config loader checks settings
// before dialling anything.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		validate func() error
		field    string // "" when valid
	}{
		{"RelayConfig zero", outbox.RelayConfig{}.Validate, ""},
		{"RelayConfig batch", outbox.RelayConfig{PublishBatchSize: 500, MaxInFlight: 100}.Validate, "PublishBatchSize"},
		{"RelayConfig small MaxInFlight, default batch", outbox.RelayConfig{MaxInFlight: 100}.Validate, ""},
		{"RelayConfig WAL heartbeat off", outbox.RelayConfig{WAL: &outbox.WALConfig{Heartbeat: -1}}.Validate, ""},
		{"RelayConfig WAL heartbeat", outbox.RelayConfig{WAL: &outbox.WALConfig{Heartbeat: -time.Second}}.Validate, "WAL.Heartbeat"},
		{"WriterConfig zero", outbox.WriterConfig{}.Validate, ""},
		{"WriterConfig limits", outbox.WriterConfig{Limits: outbox.Limits{MaxHeaders: -1}}.Validate, "Limits.MaxHeaders"},
		{"InboxConfig", outbox.InboxConfig{Consumer: "shipping"}.Validate, ""},
		{"InboxConfig zero", outbox.InboxConfig{}.Validate, "Consumer"},
		{"outboxpgx", outboxpgx.Config{}.Validate, ""},
		{"outboxpgx schema", outboxpgx.Config{Schema: "Bad Schema"}.Validate, "Schema"},
		{"outboxsql prefix", outboxsql.Config{Prefix: "bad-prefix"}.Validate, "Prefix"},
		{"outboxmysql", outboxmysql.Config{Prefix: "app_"}.Validate, ""},
		{"outboxmysql prefix", outboxmysql.Config{Prefix: "bad-prefix"}.Validate, "Prefix"},
		{"outboxsqlite prefix", outboxsqlite.Config{Prefix: "bad-prefix"}.Validate, "Prefix"},
		{"outboxnats", outboxnats.Config{Route: "events.{topic}"}.Validate, ""},
		{"outboxnats route", outboxnats.Config{Route: "events.{nope}"}.Validate, "Route"},
		{"outboxnats consumer", outboxnats.ConsumerConfig{Durable: "d"}.Validate, "Stream"},
		{"outboxamqp exchange", outboxamqp.Config{Exchange: string(make([]byte, 300))}.Validate, "Exchange"},
		{"outboxamqp consumer", outboxamqp.ConsumerConfig{}.Validate, "Queue.Name"},
		{"outboxkafka", outboxkafka.Config{}.Validate, ""},
		{"outboxkafka consumer", outboxkafka.ConsumerConfig{}.Validate, "Group"},
	} {
		err := tc.validate()
		var ce *outbox.ConfigError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v, want valid", tc.name, err)
		case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
			t.Errorf("%s: %v, want a *ConfigError for %s", tc.name, err, tc.field)
		}
	}
}
