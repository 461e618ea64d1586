package outboxcli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/brokers"
)

// A config file's destinations and routing keys give one relay several brokers:
//
//	broker: nats://127.0.0.1:4222        # the destination named "default"
//	destinations:
//	  audit:
//	    broker: amqp://guest:guest@127.0.0.1:5672/
//	    route: audit.{topic}
//	    rabbitmq-exchange: audit
//	routing:
//	  - topic: "audit.*"
//	    destination: audit
//
// Each destination takes the settings --broker does (broker, route, the --broker-tls-*
// files and its broker's own settings); the rules are tried in order, and a message
// that none matches goes to --default-destination.

// defaultDestination is the destination --broker and its flags describe.
const defaultDestination = "default"

// destItem is one entry of the destinations key.
type destItem struct {
	name   string
	line   int
	values map[string]configEntry
}

// ruleItem is one entry of the routing key.
type ruleItem struct {
	line  int
	rule  outbox.Rule
	route string // the rule's own route template; empty: its destination's
}

// parseDestinations reads the destinations key: a mapping of names to settings.
func (cf *configFile) parseDestinations(v *yaml.Node) ([]destItem, error) {
	if v.Kind != yaml.MappingNode || len(v.Content) == 0 {
		return nil, usageErrorf("%s: key \"destinations\": want a mapping of names to settings (audit: {broker: amqp://...})", cf.at(v.Line))
	}
	var items []destItem
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		name := k.Value
		where := cf.at(k.Line)
		switch {
		case k.Kind != yaml.ScalarNode || !validFleetName(name):
			return nil, usageErrorf("%s: destination %q: want a name of letters, digits and . _ - (it appears in logs and metrics)", where, name)
		case name == defaultDestination || name == "none":
			return nil, usageErrorf("%s: destination %q: the name is reserved (default is --broker's destination; none sends nowhere)", where, name)
		case slices.ContainsFunc(items, func(d destItem) bool { return d.name == name }):
			return nil, usageErrorf("%s: destination %q appears twice", where, name)
		case val.Kind != yaml.MappingNode || len(val.Content) == 0:
			return nil, usageErrorf("%s: destination %q: want a mapping of settings (broker: nats://..., route: ...)", where, name)
		}
		d := destItem{name: name, line: k.Line, values: map[string]configEntry{}}
		for j := 0; j+1 < len(val.Content); j += 2 {
			sk, sv := val.Content[j], val.Content[j+1]
			if _, dup := d.values[sk.Value]; dup {
				return nil, usageErrorf("%s: key %q appears twice in destination %q", cf.at(sk.Line), sk.Value, name)
			}
			if sk.Kind != yaml.ScalarNode {
				return nil, usageErrorf("%s: destination %q: keys are setting names", cf.at(sk.Line), name)
			}
			e, err := cf.entry(sk.Value, sk, sv)
			if err != nil {
				return nil, err
			}
			d.values[sk.Value] = e
		}
		if _, ok := d.values["broker"]; !ok {
			return nil, usageErrorf("%s: destination %q: broker is required (its URL: %s)", where, name, brokers.Examples())
		}
		items = append(items, d)
	}
	return items, nil
}

// ruleKeys are the keys of a routing rule.
var ruleKeys = []string{"topic", "aggregate-type", "event-type", "headers", "destination", "route"}

// parseRouting reads the routing key: a list of rules.
func (cf *configFile) parseRouting(v *yaml.Node) ([]ruleItem, error) {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		return nil, usageErrorf("%s: key \"routing\": want a list of rules (- topic: \"audit.*\"\n  destination: audit)", cf.at(v.Line))
	}
	var items []ruleItem
	for _, item := range v.Content {
		if item.Kind != yaml.MappingNode || len(item.Content) == 0 {
			return nil, usageErrorf("%s: a rule is a mapping (topic: \"audit.*\", destination: audit)", cf.at(item.Line))
		}
		r := ruleItem{line: item.Line}
		seen := map[string]bool{}
		for i := 0; i+1 < len(item.Content); i += 2 {
			k, val := item.Content[i], item.Content[i+1]
			where := cf.at(k.Line)
			if !slices.Contains(ruleKeys, k.Value) {
				return nil, usageErrorf("%s: a rule has no key %q: it takes %s", where, k.Value, strings.Join(ruleKeys, ", "))
			}
			if seen[k.Value] {
				return nil, usageErrorf("%s: key %q appears twice in one rule", where, k.Value)
			}
			seen[k.Value] = true
			if k.Value == "headers" {
				if val.Kind != yaml.MappingNode || len(val.Content) == 0 {
					return nil, usageErrorf("%s: headers: want a mapping of header names to values or globs", where)
				}
				r.rule.Headers = map[string]string{}
				for j := 0; j+1 < len(val.Content); j += 2 {
					hk, hv := val.Content[j], val.Content[j+1]
					if hk.Kind != yaml.ScalarNode || hv.Kind != yaml.ScalarNode || hv.Tag == "!!null" {
						return nil, usageErrorf("%s: headers: want plain names and values", cf.at(hk.Line))
					}
					r.rule.Headers[hk.Value] = hv.Value
				}
				continue
			}
			if val.Kind != yaml.ScalarNode || val.Tag == "!!null" {
				return nil, usageErrorf("%s: key %q: want a plain value", where, k.Value)
			}
			switch k.Value {
			case "topic":
				r.rule.Topic = val.Value
			case "aggregate-type":
				r.rule.AggregateType = val.Value
			case "event-type":
				r.rule.EventType = val.Value
			case "destination":
				r.rule.Destination = val.Value
			case "route":
				r.route = val.Value
			}
		}
		if r.rule.Destination == "" {
			return nil, usageErrorf("%s: a rule needs a destination", cf.at(item.Line))
		}
		items = append(items, r)
	}
	return items, nil
}

// destinations are a relay's checked destinations and its routing, ready to open.
type destinations struct {
	names   []string
	urls    []string
	routes  []string
	dests   []*brokers.Dest
	routing outbox.Routing
}

// checkDestinations checks the config file's destinations and routing, before anything
// connects; def is --broker's, checked already. It returns nil when the file names
// none: the relay publishes to --broker alone.
func (o *relayFlags) checkDestinations(inv *invocation, log *slog.Logger, def *brokers.Dest) (*destinations, error) {
	cf := inv.config
	if cf == nil || cf.destinations == nil && cf.routing == nil {
		if o.defaultDest != defaultDestination {
			return nil, usageErrorf("--default-destination: only used with a config file's destinations and routing")
		}
		return nil, nil
	}
	ds := &destinations{}
	// --broker's destination is opened when something sends to it.
	if o.defaultDest == defaultDestination || slices.ContainsFunc(cf.routing, func(r ruleItem) bool { return r.rule.Destination == defaultDestination }) {
		ds.names, ds.urls, ds.routes, ds.dests = []string{defaultDestination}, []string{o.broker.url}, []string{o.broker.route}, []*brokers.Dest{def}
	}
	for _, item := range cf.destinations {
		d, err := o.checkDestination(inv, log, item)
		if err != nil {
			return nil, usageErrorf("%s: destination %q: %s", cf.at(item.line), item.name, strings.TrimPrefix(err.Error(), "outbox: "))
		}
		route := outbox.RouteTopic
		if e, ok := item.values["route"]; ok {
			route = e.values[0]
		}
		ds.names, ds.urls, ds.routes, ds.dests = append(ds.names, item.name), append(ds.urls, item.values["broker"].values[0]), append(ds.routes, route), append(ds.dests, d)
	}
	for _, r := range cf.routing {
		ds.routing.Rules = append(ds.routing.Rules, r.rule)
	}
	if o.defaultDest != "none" {
		ds.routing.Default = o.defaultDest
	}
	if err := ds.routing.Validate(ds.names...); err != nil {
		if ce, ok := err.(*outbox.ConfigError); ok {
			var i int
			if _, scanErr := fmt.Sscanf(ce.Field, "Rules[%d]", &i); scanErr == nil && i < len(cf.routing) {
				return nil, usageErrorf("%s: routing rule %d: %s: %s", cf.at(cf.routing[i].line), i+1, ruleKey(ce.Field), ce.Reason)
			}
			return nil, usageErrorf("--default-destination: %s", ce.Reason)
		}
		return nil, err
	}
	// A rule with a route of its own sends to its destination's broker under that route:
	// a destination of its own, DEST@ruleN, with the destination's settings.
	for i, r := range cf.routing {
		if r.route == "" {
			continue
		}
		d, url, err := o.checkRouteOf(inv, log, r.rule.Destination, r.route)
		if err != nil {
			msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "outbox: "), "--route: ")
			return nil, usageErrorf("%s: routing rule %d: route: %s", cf.at(r.line), i+1, msg)
		}
		name := fmt.Sprintf("%s@rule%d", r.rule.Destination, i+1)
		ds.names, ds.urls, ds.routes, ds.dests = append(ds.names, name), append(ds.urls, url), append(ds.routes, r.route), append(ds.dests, d)
		ds.routing.Rules[i].Destination = name
	}
	return ds, nil
}

// checkRouteOf checks the destination named dest (--broker's for default) with route
// instead of its own, and returns it and its URL.
func (o *relayFlags) checkRouteOf(inv *invocation, log *slog.Logger, dest, route string) (*brokers.Dest, string, error) {
	if dest == defaultDestination {
		b := *o.broker
		b.route = route
		d, err := b.check(log, inv.secrets)
		return d, b.url, err
	}
	for _, item := range inv.config.destinations {
		if item.name != dest {
			continue
		}
		values := maps.Clone(item.values)
		values["route"] = configEntry{values: []string{route}}
		d, err := o.checkDestination(inv, log, destItem{name: dest, line: item.line, values: values})
		return d, item.values["broker"].values[0], err
	}
	return nil, "", fmt.Errorf("unknown destination %q", dest) // (Validate checked the names)
}

// ruleKey is the config file's key for a field of an outbox.Rule in a ConfigError
// ("Rules[0].EventType" -> "event-type", "Rules[0].Headers[\"x\"]" -> "headers: \"x\"").
func ruleKey(field string) string {
	_, f, _ := strings.Cut(field, "].")
	if h, ok := strings.CutPrefix(f, "Headers["); ok {
		return "headers: " + strings.TrimSuffix(h, "]")
	}
	return map[string]string{"Topic": "topic", "AggregateType": "aggregate-type", "EventType": "event-type", "Destination": "destination"}[f]
}

// checkDestination checks one entry of the destinations key as --broker and its flags
// are checked.
func (o *relayFlags) checkDestination(inv *invocation, log *slog.Logger, item destItem) (*brokers.Dest, error) {
	url := item.values["broker"].values[0]
	inv.secrets.addBroker(url)
	k, err := brokers.ForURL(url)
	if err != nil {
		return nil, err
	}
	fs := flag.NewFlagSet(item.name, flag.ContinueOnError)
	var tlsFiles brokers.TLSFiles
	tlsFiles.Flags(fs)
	opts := k.Flags(fs)
	route := outbox.RouteTopic
	options := map[string][]string{}
	for _, key := range sortedKeys(item.values) {
		e := item.values[key]
		switch {
		case key == "broker":
		case key == "route":
			route = e.values[0]
		case strings.HasPrefix(key, "broker-tls-"):
			if fs.Lookup(key) == nil || len(e.values) != 1 {
				return nil, fmt.Errorf("--%s: no such TLS setting, or more than one value", key)
			}
			if err := fs.Set(key, e.values[0]); err != nil {
				return nil, fmt.Errorf("--%s: %v", key, err)
			}
		default:
			options[key] = e.values
		}
	}
	tls, err := tlsFiles.Config()
	if err != nil {
		return nil, err
	}
	return opts.Check(url, brokers.Settings{Route: route, TLS: tls, Log: log.With("destination", item.name),
		Secrets: brokerSecretsOf{inv.secrets}, Options: options, CloudEvents: o.broker.ce.config()})
}

// fingerprint identifies where a relay sends messages (outbox.RelayConfig.Fingerprint):
// a short hash of each destination's name, broker kind, address without credentials
// and route, and of the routing rules. Relays of one outbox whose fingerprints differ
// never hold shards at the same time. ds is nil for a relay that publishes to --broker
// alone, a broker of kind label. Other broker settings are not part of it.
func (o *relayFlags) fingerprint(label string, ds *destinations) string {
	type destination struct{ Name, Broker, URL, Route string }
	var v struct {
		Destinations []destination
		Rules        []outbox.Rule
		Default      string
	}
	if ds == nil {
		v.Destinations = []destination{{defaultDestination, label, brokers.Redact(o.broker.url), o.broker.route}}
		v.Default = defaultDestination
	} else {
		for i, name := range ds.names {
			v.Destinations = append(v.Destinations, destination{name, ds.dests[i].Broker().Label, brokers.Redact(ds.urls[i]), ds.routes[i]})
		}
		v.Rules, v.Default = ds.routing.Rules, ds.routing.Default
	}
	b, _ := json.Marshal(v) // (strings, slices and maps of strings: it cannot fail)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// label is the broker label of the relay's metrics: the destinations' kinds, "amqp,nats".
func (ds *destinations) label() string {
	var labels []string
	for _, d := range ds.dests {
		if !slices.Contains(labels, d.Broker().Label) {
			labels = append(labels, d.Broker().Label)
		}
	}
	slices.Sort(labels)
	return strings.Join(labels, ",")
}

// openOne connects to the i-th destination.
func (ds *destinations) openOne(ctx context.Context, log *slog.Logger, i int) (*brokers.Opened, error) {
	d := ds.dests[i]
	log.Info("connecting to a destination", "destination", ds.names[i], "broker", d.Broker().Name, "url", brokers.Redact(ds.urls[i]))
	b, err := d.Open(ctx)
	if err != nil {
		return nil, fmt.Errorf("destination %q: connect to %s at %s: %w", ds.names[i], d.Broker().Name, brokers.Redact(ds.urls[i]), brokerUsage(err))
	}
	return b, nil
}

// open connects to every destination and returns the router over them, a /readyz check
// of each destination whose publisher can be pinged, and what closes them all.
func (ds *destinations) open(ctx context.Context, log *slog.Logger) (pub *outbox.Router, checks []readyCheck, closeAll func(), err error) {
	var opened []*brokers.Opened
	closeAll = func() {
		for _, b := range opened {
			b.Close()
		}
	}
	var dests []outbox.Destination
	for i := range ds.dests {
		b, err := ds.openOne(ctx, log, i)
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		opened = append(opened, b)
		if p, ok := b.Publisher.(outbox.Pinger); ok {
			checks = append(checks, readyCheck{name: "destination " + ds.names[i], check: p.Ping})
		}
		dests = append(dests, outbox.Destination{Name: ds.names[i], Publisher: b.Publisher})
	}
	router, err := outbox.NewRouter(ds.routing, dests...)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return router, checks, closeAll, nil
}
