package outbox

import (
	"errors"
	"fmt"
	"strings"
)

// Route maps a message to its broker destination (a NATS subject, a Kafka topic, an AMQP
// routing key, a Redis stream, an SQS queue, a webhook path) by a template. Every
// publisher takes one, so the same configuration string means the same thing for every
// broker.
//
// A template is text with placeholders in braces:
//
//	{topic}           Message.Topic
//	{aggregate_type}  Message.AggregateType
//	{event_type}      Message.EventType
//	{key}             Message.Key
//
// "{topic}" (RouteTopic) sends each message where its topic says; "events.{topic}" puts
// a prefix in front; "outbox.event.{aggregate_type}" (RouteDebezium) is the layout of
// Debezium's outbox event router, for consumers moving from it. A template without
// placeholders sends every message to one destination.
//
// A placeholder whose field is empty fails the message with a *RouteError, a rejection:
// the relay counts an attempt and dead-letters the message after the limit, since
// retrying cannot fill the field. A Route is immutable and safe for concurrent use.
type Route struct {
	template string
	parts    []routePart
}

type routePart struct {
	text  string                // literal text, when field is nil
	field func(*Message) string // placeholder
	name  string                // placeholder name, for errors
}

// Templates for common layouts.
const (
	RouteTopic    = "{topic}"
	RouteDebezium = "outbox.event.{aggregate_type}"
)

var routeFields = map[string]func(*Message) string{
	"topic":          func(m *Message) string { return m.Topic },
	"aggregate_type": func(m *Message) string { return m.AggregateType },
	"event_type":     func(m *Message) string { return m.EventType },
	"key":            func(m *Message) string { return m.Key },
}

// ParseRoute parses a route template. An empty template means RouteTopic. It returns a
// *ConfigError (field "route") for an unknown placeholder or an unbalanced brace.
func ParseRoute(template string) (*Route, error) {
	if template == "" {
		template = RouteTopic
	}
	r := &Route{template: template}
	rest := template
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			r.parts = append(r.parts, routePart{text: rest})
			break
		}
		if rest[open] == '}' {
			return nil, &ConfigError{Field: "route", Reason: fmt.Sprintf("%q: unmatched '}'", template)}
		}
		if open > 0 {
			r.parts = append(r.parts, routePart{text: rest[:open]})
		}
		end := strings.IndexAny(rest[open+1:], "{}")
		if end < 0 || rest[open+1+end] != '}' {
			return nil, &ConfigError{Field: "route", Reason: fmt.Sprintf("%q: unmatched '{'", template)}
		}
		name := rest[open+1 : open+1+end]
		field, ok := routeFields[name]
		if !ok {
			return nil, &ConfigError{Field: "route", Reason: fmt.Sprintf("%q: unknown placeholder {%s}; known: {topic}, {aggregate_type}, {event_type}, {key}", template, name)}
		}
		r.parts = append(r.parts, routePart{field: field, name: name})
		rest = rest[open+1+end+1:]
	}
	return r, nil
}

// MustParseRoute is ParseRoute for templates known to be valid; it panics on an error.
func MustParseRoute(template string) *Route {
	r, err := ParseRoute(template)
	if err != nil {
		panic(err)
	}
	return r
}

// String returns the template.
func (r *Route) String() string { return r.template }

// Static reports whether the template has no placeholders, and then its destination.
func (r *Route) Static() (string, bool) {
	for _, p := range r.parts {
		if p.field != nil {
			return "", false
		}
	}
	return r.template, true
}

// Example returns the destination of a message whose fields are their own names
// ("events.{topic}" gives "events.topic"), for checking a template against a broker's
// naming rules when the publisher starts.
func (r *Route) Example() string {
	var b strings.Builder
	for _, p := range r.parts {
		if p.field == nil {
			b.WriteString(p.text)
		} else {
			b.WriteString(p.name)
		}
	}
	return b.String()
}

// Destination returns m's destination, or a *RouteError when a placeholder's field is
// empty.
func (r *Route) Destination(m *Message) (string, error) { return r.DestinationEscaped(m, nil) }

// DestinationEscaped is Destination with every placeholder's value passed through escape
// (nil: taken as it is), for destinations where a field's characters have a meaning of
// their own, such as a URL: the template's literal text is left as written.
func (r *Route) DestinationEscaped(m *Message, escape func(string) string) (string, error) {
	value := func(p routePart) (string, error) {
		v := p.field(m)
		if v == "" {
			return "", &RouteError{Template: r.template, Field: p.name}
		}
		if escape != nil {
			v = escape(v)
		}
		return v, nil
	}
	if len(r.parts) == 1 && r.parts[0].field != nil {
		return value(r.parts[0]) // the common "{topic}", without a builder
	}
	var b strings.Builder
	for _, p := range r.parts {
		if p.field == nil {
			b.WriteString(p.text)
			continue
		}
		v, err := value(p)
		if err != nil {
			return "", err
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// Check returns a check for WriterConfig.Check that refuses, at write time, a message
// this route cannot map (a placeholder's field is empty) or maps to a name that valid
// rejects: valid returns why the name is not one the broker takes, or "". what names
// the broker's names in errors ("NATS subject"). The *ValidationError names the field
// of the route's first placeholder ("Topic" for "events.{topic}").
func (r *Route) Check(what string, valid func(name string) string) func(*Message) error {
	field := "Topic"
	for _, p := range r.parts {
		if p.field != nil {
			field = goFieldNames[p.name]
			break
		}
	}
	return func(m *Message) error {
		name, err := r.Destination(m)
		if err != nil {
			var re *RouteError
			if errors.As(err, &re) {
				return &ValidationError{Field: goFieldNames[re.Field], Reason: fmt.Sprintf("required by the route %q", r.template)}
			}
			return err
		}
		if reason := valid(name); reason != "" {
			return &ValidationError{Field: field, Reason: fmt.Sprintf("the route %q gives the %s %q: %s", r.template, what, name, reason)}
		}
		return nil
	}
}

var goFieldNames = map[string]string{"topic": "Topic", "aggregate_type": "AggregateType", "event_type": "EventType", "key": "Key"}

// RouteError is returned for a message that a Route cannot map: a placeholder's field is
// empty. errors.Is(err, ErrUnroutable) is true.
type RouteError struct {
	Template string
	Field    string
}

func (e *RouteError) Error() string {
	return fmt.Sprintf("outbox: route %q: the message has no %s", e.Template, e.Field)
}

// Is makes errors.Is(err, ErrUnroutable) true.
func (e *RouteError) Is(target error) bool { return target == ErrUnroutable }

// ErrUnroutable matches errors for messages that have no destination: a route placeholder
// with an empty field, or (for brokers that report it) a message the broker could not
// route to any queue.
var ErrUnroutable = errors.New("outbox: message is unroutable")
