package outbox

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
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

// FuzzRoute checks ParseRoute and Destination against a reference written differently
// (a regular expression): a template parses exactly when every brace belongs to a known
// placeholder; a destination is the template with each placeholder replaced by its
// field's whole value, escaped once and whole, so that no brace of the template is left
// in it; an empty field is ErrUnroutable; Static and Example agree with the template.
func FuzzRoute(f *testing.F) {
	for _, seed := range [][5]string{
		{"{topic}", "orders", "order", "placed", "o-1"},
		{"", "orders", "", "", ""},
		{"events.{topic}.{event_type}", "a.b", "x", "y/z", "k"},
		{"outbox.event.{aggregate_type}", "t", "", "", ""},
		{"{key}{key}", "t", "", "", "{topic}"},
		{"fixed", "t", "", "", ""},
		{"{topic", "t", "", "", ""},
		{"topic}", "t", "", "", ""},
		{"{{topic}}", "t", "", "", ""},
		{"{nope}", "t", "", "", ""},
		{"{}", "t", "", "", ""},
		{"https://h/{topic}?x={key}", "../admin", "", "", "a&b=c#d"},
		{"{topic}", "é\x00\xff", "", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3], seed[4])
	}
	valid := regexp.MustCompile(`^(?:[^{}]|\{(?:topic|aggregate_type|event_type|key)\})*$`)
	placeholder := regexp.MustCompile(`\{(topic|aggregate_type|event_type|key)\}`)
	f.Fuzz(func(t *testing.T, template, topic, aggregateType, eventType, key string) {
		r, err := ParseRoute(template)
		effective := template
		if effective == "" {
			effective = RouteTopic
		}
		if ok := valid.MatchString(effective); (err == nil) != ok {
			t.Fatalf("ParseRoute(%q): err %v, but the template is valid: %v", template, err, ok)
		}
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != "route" {
				t.Fatalf("ParseRoute(%q): %T %v, want a *ConfigError for route", template, err, err)
			}
			return
		}
		if r.String() != effective {
			t.Fatalf("String() = %q, want %q", r.String(), effective)
		}
		names := placeholder.FindAllStringSubmatch(effective, -1)
		if static, ok := r.Static(); ok != (len(names) == 0) || (ok && static != effective) {
			t.Fatalf("Static() = %q, %v for %q", static, ok, effective)
		}
		if ex := r.Example(); ex != placeholder.ReplaceAllString(effective, "$1") {
			t.Fatalf("Example() = %q for %q", ex, effective)
		}

		m := &Message{Topic: topic, AggregateType: aggregateType, EventType: eventType, Key: key}
		fields := map[string]string{"topic": topic, "aggregate_type": aggregateType, "event_type": eventType, "key": key}
		empty := false
		for _, n := range names {
			empty = empty || fields[n[1]] == ""
		}
		// The escape marks each value it is given, so that a value escaped twice, in
		// pieces or not at all shows.
		calls := 0
		mark := func(v string) string { calls++; return "\x01" + strconv.Quote(v) + "\x02" }
		for i, escape := range []func(string) string{nil, mark, url.PathEscape} {
			calls = 0
			got, err := r.DestinationEscaped(m, escape)
			escaped := calls
			if empty {
				if !errors.Is(err, ErrUnroutable) {
					t.Fatalf("%q with an empty field: %q, %v; want ErrUnroutable", effective, got, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%q: %v", effective, err)
			}
			want := placeholder.ReplaceAllStringFunc(effective, func(p string) string {
				v := fields[p[1:len(p)-1]]
				if escape != nil {
					v = escape(v)
				}
				return v
			})
			if got != want {
				t.Fatalf("DestinationEscaped(%q) = %q, want %q", effective, got, want)
			}
			// No brace of the template is left: those in got come from the values.
			braces := strings.Count(got, "{") + strings.Count(got, "}")
			fromValues := 0
			for _, n := range names {
				v := fields[n[1]]
				if escape != nil {
					v = escape(v)
				}
				fromValues += strings.Count(v, "{") + strings.Count(v, "}")
			}
			if braces != fromValues {
				t.Fatalf("DestinationEscaped(%q) = %q: %d braces, %d from the values", effective, got, braces, fromValues)
			}
			if i == 1 && escaped != len(names) {
				t.Fatalf("escape called %d times for %d placeholders", escaped, len(names))
			}
		}
		if d, err := r.Destination(m); !empty && (err != nil || d != placeholder.ReplaceAllStringFunc(effective, func(p string) string { return fields[p[1:len(p)-1]] })) {
			t.Fatalf("Destination(%q) = %q, %v", effective, d, err)
		}
	})
}
