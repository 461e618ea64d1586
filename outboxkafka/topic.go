package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// CheckTopic returns a *NoTopicError (errors.Is(err, ErrNoTopic)) if topic does not
// exist, another error if it cannot tell, and nil otherwise. It never creates the topic.
// Run it at start-up for the topics the publisher will use (Publisher.Record gives a
// message's topic): a missing topic otherwise shows only as outages when the relay
// publishes.
func (p *Publisher) CheckTopic(ctx context.Context, topic string) error {
	if reason := checkTopic(topic); reason != "" {
		return fmt.Errorf("outboxkafka: invalid topic %q: %s", topic, reason)
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, p.cl)
	if err == nil && len(resp.Topics) != 1 {
		err = fmt.Errorf("the broker answered for %d topics", len(resp.Topics))
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return &NoTopicError{Topic: topic, Err: err}
	default:
		return fmt.Errorf("outboxkafka: look up topic %q: %w", topic, err)
	}
}

// Seeds returns the seed brokers of a kafka:// URL, for Dial: "kafka://k1:9092,k2:9092"
// and "kafka://k1:9092,kafka://k2:9092" both give k1:9092 and k2:9092; a host without a
// port gets 9092. The URL carries addresses only: credentials go in Config.SASL, TLS in
// Config.TLS. Errors never quote the URL.
func Seeds(url string) ([]string, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(url), "kafka://")
	if !ok {
		return nil, errors.New("outboxkafka: not a kafka:// URL")
	}
	var seeds []string
	for i, part := range strings.Split(rest, ",") {
		part = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(part), "kafka://"), "/")
		switch {
		case part == "":
			return nil, fmt.Errorf("outboxkafka: kafka:// URL: broker %d is empty", i+1)
		case strings.Contains(part, "@"):
			return nil, errors.New("outboxkafka: kafka:// URL: credentials do not go in the URL (use SASL settings)")
		case strings.ContainsAny(part, "/?#"):
			return nil, fmt.Errorf("outboxkafka: kafka:// URL: broker %d: want host:port, without path or query", i+1)
		}
		host, port, err := net.SplitHostPort(part)
		if err != nil {
			if host, port = part, "9092"; strings.Contains(part, ":") && !strings.HasPrefix(part, "[") {
				return nil, fmt.Errorf("outboxkafka: kafka:// URL: broker %d: want host:port ([addr]:port for IPv6)", i+1)
			}
			host = strings.Trim(host, "[]")
		}
		if host == "" || port == "" {
			return nil, fmt.Errorf("outboxkafka: kafka:// URL: broker %d: want host:port", i+1)
		}
		seeds = append(seeds, net.JoinHostPort(host, port))
	}
	return seeds, nil
}
