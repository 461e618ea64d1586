package outbox

import (
	"errors"
	"testing"
)

func TestRoute(t *testing.T) {
	m := &Message{Topic: "orders", Key: "o-1", AggregateType: "order", EventType: "placed"}
	for _, tc := range []struct{ template, want string }{
		{"", "orders"},
		{RouteTopic, "orders"},
		{RouteDebezium, "outbox.event.order"},
		{"events.{topic}.{event_type}", "events.orders.placed"},
		{"{aggregate_type}-{key}", "order-o-1"},
		{"fixed", "fixed"},
	} {
		r, err := ParseRoute(tc.template)
		if err != nil {
			t.Fatalf("ParseRoute(%q): %v", tc.template, err)
		}
		got, err := r.Destination(m)
		if err != nil || got != tc.want {
			t.Errorf("%q: got %q, %v; want %q", tc.template, got, err, tc.want)
		}
	}
	if d, ok := MustParseRoute("fixed").Static(); !ok || d != "fixed" {
		t.Errorf("Static of a fixed route: %q, %v", d, ok)
	}
	if _, ok := MustParseRoute("a.{topic}").Static(); ok {
		t.Error("a route with a placeholder reported static")
	}
}

func TestRouteBadTemplate(t *testing.T) {
	for _, tpl := range []string{"{nope}", "a.{topic", "a}", "{topic}{", "{{topic}}"} {
		_, err := ParseRoute(tpl)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "route" {
			t.Errorf("ParseRoute(%q) = %v, want a *ConfigError for route", tpl, err)
		}
	}
}

func TestRouteEmptyField(t *testing.T) {
	_, err := MustParseRoute(RouteDebezium).Destination(&Message{Topic: "orders"})
	var re *RouteError
	if !errors.As(err, &re) || re.Field != "aggregate_type" || !errors.Is(err, ErrUnroutable) || IsOutage(err) {
		t.Fatalf("got %v, want a *RouteError for aggregate_type that is a rejection", err)
	}
}

func TestWireHeaders(t *testing.T) {
	id := NewID()
	m := &Message{ID: id, Topic: "t", Key: "k", ContentType: "text/plain", Headers: map[string]string{"traceparent": "00-x", HeaderTopic: "spoofed"}}
	got := map[string]string{}
	m.WireHeaders(func(k, v string) { got[k] = v })
	want := map[string]string{"traceparent": "00-x", HeaderID: id.String(), HeaderDedupKey: id.String(), HeaderKey: "k", HeaderTopic: "t", HeaderContentType: "text/plain"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}
