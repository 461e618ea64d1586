package outbox

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/broken"
	"github.com/outboxkit/outbox/outboxdriver"
)

// A Rule sends the messages it matches to a destination. Each condition set must hold;
// an empty one matches any message. Topic, AggregateType, EventType and the header
// values are exact names or globs in path.Match syntax ("orders.*", "audit.?",
// "[a-f]*"); '*' matches any run of characters, dots included.
type Rule struct {
	Topic         string
	AggregateType string
	EventType     string
	// Headers maps header names to the value (or glob) each must have; a header the
	// message lacks does not match, whatever the glob.
	Headers map[string]string
	// Destination names the destination of the messages matched.
	Destination string
}

// Routing maps each message to a named destination: the first Rule that matches it,
// else Default. A message that neither routes (no rule matches and Default is empty)
// is unroutable: a Writer whose Check is the Routing's refuses it, and a Router
// dead-letters it with that reason, so it is never dropped silently.
type Routing struct {
	Rules   []Rule
	Default string
}

// Validate checks the rules' globs, and that every destination they and Default name is
// one of dests. Its errors are *ConfigError naming the rule ("Rules[2].Topic").
func (r Routing) Validate(dests ...string) error {
	known := func(field, name string) error {
		if !slices.Contains(dests, name) {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("unknown destination %q; known: %v", name, dests)}
		}
		return nil
	}
	for i, rule := range r.Rules {
		at := fmt.Sprintf("Rules[%d]", i)
		if rule.Destination == "" {
			return &ConfigError{Field: at + ".Destination", Reason: "required"}
		}
		if err := known(at+".Destination", rule.Destination); err != nil {
			return err
		}
		globs := map[string]string{"Topic": rule.Topic, "AggregateType": rule.AggregateType, "EventType": rule.EventType}
		for name, v := range rule.Headers {
			if reason := checkHeaderName(name); reason != "" {
				return &ConfigError{Field: fmt.Sprintf("%s.Headers[%q]", at, name), Reason: reason}
			}
			globs[fmt.Sprintf("Headers[%q]", name)] = v
		}
		for field, glob := range globs {
			if _, err := path.Match(glob, ""); err != nil {
				return &ConfigError{Field: at + "." + field, Reason: fmt.Sprintf("%q is not a valid glob: %v", glob, err)}
			}
		}
	}
	if r.Default != "" {
		return known("Default", r.Default)
	}
	return nil
}

// Destination returns the name of m's destination, or false when m is unroutable.
func (r Routing) Destination(m *Message) (string, bool) {
	for i := range r.Rules {
		if r.Rules[i].matches(m) {
			return r.Rules[i].Destination, true
		}
	}
	return r.Default, r.Default != ""
}

func (rule *Rule) matches(m *Message) bool {
	match := func(glob, s string) bool {
		if glob == "" {
			return true
		}
		ok, _ := path.Match(glob, s) // validated: ErrBadPattern cannot happen
		return ok
	}
	if broken.Has(broken.RouteTopicOnly) { // canary: the other conditions ignored
		return match(rule.Topic, m.Topic)
	}
	if !match(rule.Topic, m.Topic) || !match(rule.AggregateType, m.AggregateType) || !match(rule.EventType, m.EventType) {
		return false
	}
	for name, glob := range rule.Headers {
		v, ok := m.Headers[name]
		if !ok || !match(glob, v) {
			return false
		}
	}
	return true
}

// Check returns a check for WriterConfig.Check: it refuses a message that does not
// route, and one that its destination's check (checks, by destination name: say
// outboxnats.Check of that destination's route) refuses.
func (r Routing) Check(checks map[string]func(*Message) error) func(*Message) error {
	return func(m *Message) error {
		dest, ok := r.Destination(m)
		if !ok {
			return &ValidationError{Field: "Topic", Reason: unroutableReason(m)}
		}
		if check := checks[dest]; check != nil {
			return check(m)
		}
		return nil
	}
}

// Priorities returns a default priority for WriterConfig.Priority: that of m's
// destination in byDestination (by destination name), 0 for a destination it does not
// name or a message that does not route. Priorities order the backlog in the database,
// so a destination's must be known when its messages are written: give the writers the
// routing the relays run. Values run from 1 to MaxPriority (NewWriter does not see
// them: a Write fails with a *ValidationError on one outside).
func (r Routing) Priorities(byDestination map[string]int) func(m *Message) int {
	return func(m *Message) int {
		dest, _ := r.Destination(m)
		return byDestination[dest]
	}
}

func unroutableReason(m *Message) string {
	return fmt.Sprintf("no routing rule matches the message (topic %q, aggregate type %q, event type %q) and there is no default destination",
		m.Topic, m.AggregateType, m.EventType)
}

// A Destination is a named publisher of a Router. The name appears in logs, metrics and
// errors: it must hold no secret.
type Destination struct {
	Name      string
	Publisher Publisher
}

// Router is a Publisher that sends each message to the destination its Routing names,
// each destination's share of a batch at once. An outage of one destination (its
// publisher reports Outage) is that destination's alone: its messages fail with a
// *DestinationOutageError, so the relay defers them (and the later messages of their
// keys) without counting an attempt, and the other destinations' messages go on. For a
// while after an outage (a backoff from RouterOutageMin to RouterOutageMax, ended early
// when the destination's publisher reports it is connected again) the router fails that
// destination's messages at once rather than wait for the publish timeout. An
// unroutable message is rejected as Permanent: the relay dead-letters it with the
// reason.
//
// A relay whose publisher is a Router of several destinations sends each batch to one
// destination, and lets no destination take more than three quarters of its publish
// workers (MaxInFlight / PublishBatchSize) and of MaxInFlight, so that a slow
// destination leaves room to the others.
type Router struct {
	routing Routing
	dests   map[string]*routerDest
	order   []string
}

// The backoff of a destination after an outage.
const (
	RouterOutageMin = 500 * time.Millisecond
	RouterOutageMax = 30 * time.Second
)

type routerDest struct {
	name string
	pub  Publisher
	back <-chan struct{} // the publisher's Reconnected, or nil

	mu      sync.Mutex
	streak  int       // outages in a row
	until   time.Time // messages fail at once before this
	lastErr string    // the outage's error text
	up      bool      // no outage since a message last reached it (or it reconnected)
	since   time.Time // when up last changed; the router's creation before

	published, failed, deferred atomic.Int64
}

// DestinationStats are the state and counters of one of a Router's destinations.
type DestinationStats struct {
	Name string
	// Up is false from an outage of the destination until a message reaches it again,
	// or its publisher reports it is connected again (Reconnector).
	Up        bool
	Since     time.Time // when Up last changed; the Router's creation before
	Published int64     // messages it confirmed
	Failed    int64     // messages it rejected (attempts counted toward MaxAttempts)
	Deferred  int64     // messages held back by its outages, no attempt counted
}

// Stats returns the state and counters of each destination, in the order given to
// NewRouter.
func (r *Router) Stats() []DestinationStats {
	out := make([]DestinationStats, 0, len(r.order))
	for _, name := range r.order {
		d := r.dests[name]
		d.mu.Lock()
		d.reconnected()
		up, since := d.up, d.since
		d.mu.Unlock()
		out = append(out, DestinationStats{Name: name, Up: up, Since: since,
			Published: d.published.Load(), Failed: d.failed.Load(), Deferred: d.deferred.Load()})
	}
	return out
}

// DestinationStates returns the state of each destination: what a relay records with
// its heartbeat, for outbox status and the console.
func (r *Router) DestinationStates() []outboxdriver.DestinationState {
	var out []outboxdriver.DestinationState
	for _, s := range r.Stats() {
		out = append(out, outboxdriver.DestinationState{Name: s.Name, Up: s.Up, Since: s.Since})
	}
	return out
}

// reconnected ends the backoff when the publisher reported it is connected again. The
// caller holds d.mu.
func (d *routerDest) reconnected() {
	select {
	case <-d.back:
		d.until = time.Time{}
		d.setUp(true)
	default:
	}
}

// setUp records the destination's state. The caller holds d.mu.
func (d *routerDest) setUp(up bool) {
	if d.up != up {
		d.up, d.since = up, time.Now()
	}
}

// NewRouter returns a Router over dests with routing. Destination names must be unique
// and non-empty, and routing must name only them (Routing.Validate).
func NewRouter(routing Routing, dests ...Destination) (*Router, error) {
	r := &Router{routing: routing, dests: map[string]*routerDest{}}
	for i, d := range dests {
		switch {
		case d.Name == "":
			return nil, &ConfigError{Field: fmt.Sprintf("Destinations[%d].Name", i), Reason: "required"}
		case d.Publisher == nil:
			return nil, &ConfigError{Field: fmt.Sprintf("Destinations[%d].Publisher", i), Reason: "required"}
		case r.dests[d.Name] != nil:
			return nil, &ConfigError{Field: fmt.Sprintf("Destinations[%d].Name", i), Reason: fmt.Sprintf("%q is given twice", d.Name)}
		}
		rd := &routerDest{name: d.Name, pub: d.Publisher, up: true, since: time.Now()}
		if rc, ok := d.Publisher.(Reconnector); ok {
			rd.back = rc.Reconnected()
		}
		r.dests[d.Name] = rd
		r.order = append(r.order, d.Name)
	}
	if len(r.order) == 0 {
		return nil, &ConfigError{Field: "Destinations", Reason: "at least one is required"}
	}
	if err := routing.Validate(r.order...); err != nil {
		return nil, err
	}
	return r, nil
}

// Publish sends each message of batch to its destination.
func (r *Router) Publish(ctx context.Context, batch []*Message) []error {
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, len(batch))
		}
		errs[i] = err
	}
	groups := map[*routerDest][]int{}
	for i, m := range batch {
		name, ok := r.routing.Destination(m)
		if !ok {
			fail(i, Permanent(fmt.Errorf("%w: %s", ErrUnroutable, unroutableReason(m))))
			continue
		}
		d := r.dests[name]
		groups[d] = append(groups[d], i)
	}
	type answer struct {
		idx  []int
		errs []error
	}
	answers := make(chan answer, len(groups))
	for d, idx := range groups {
		if len(groups) == 1 { // a relay's batch: one destination, no goroutine
			answers <- answer{idx, d.publish(ctx, batch, idx)}
		} else {
			go func() { answers <- answer{idx, d.publish(ctx, batch, idx)} }()
		}
	}
	for range groups {
		a := <-answers
		for j, err := range a.errs {
			if err != nil {
				fail(a.idx[j], err)
			}
		}
	}
	return errs
}

// publish sends batch's messages at idx, and returns their errors (nil when all were
// confirmed), an outage made the destination's own.
func (d *routerDest) publish(ctx context.Context, batch []*Message, idx []int) []error {
	d.mu.Lock()
	d.reconnected()
	down, lastErr := time.Now().Before(d.until), d.lastErr
	d.mu.Unlock()
	if down {
		d.deferred.Add(int64(len(idx)))
		return failAll(len(idx), d.outageError(lastErr+" (not tried: the destination failed recently)"))
	}
	sub := make([]*Message, len(idx))
	for j, i := range idx {
		sub[j] = batch[i]
	}
	errs := publishAll(ctx, d.pub, sub)
	confirmed, outage := errs == nil, ""
	for _, err := range errs {
		switch {
		case err == nil:
			confirmed = true
		case IsOutage(err):
			outage = err.Error()
		}
	}
	d.mu.Lock()
	switch {
	case outage != "":
		d.streak++
		d.until, d.lastErr = time.Now().Add(backoff(d.streak, RouterOutageMin, RouterOutageMax)), outage
		d.setUp(false)
	case confirmed:
		d.streak, d.until = 0, time.Time{}
		d.setUp(true)
	}
	d.mu.Unlock()
	if errs == nil {
		d.published.Add(int64(len(idx)))
		return nil
	}
	for j, err := range errs {
		if err == nil {
			d.published.Add(1)
			continue
		}
		if IsOutage(err) {
			errs[j] = d.outageError(err.Error())
		} else if dest, ok := AsDestinationOutage(err); ok {
			errs[j] = DestinationOutage(d.name+"/"+dest, err)
		}
		if _, ok := AsDestinationOutage(errs[j]); ok {
			d.deferred.Add(1)
		} else {
			d.failed.Add(1)
		}
	}
	return errs
}

// outageError is the error of a message whose destination is down: a
// *DestinationOutageError that does not wrap the publisher's *OutageError, which would
// make the relay pause every destination.
func (d *routerDest) outageError(text string) error {
	return DestinationOutage(d.name, errors.New(text))
}

// destinationOf returns the name of m's destination, "" when m is unroutable: the
// relay sends each batch to one destination.
func (r *Router) destinationOf(m *Message) string {
	name, _ := r.routing.Destination(m)
	return name
}

// Destinations returns the destinations' names, in the order given to NewRouter.
func (r *Router) Destinations() []string { return slices.Clone(r.order) }
