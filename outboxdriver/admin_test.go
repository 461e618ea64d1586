package outboxdriver

import (
	"errors"
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
