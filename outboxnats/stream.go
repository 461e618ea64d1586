package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// EnsureStream makes sure the stream name exists and captures subjects. A missing stream
// is created with subjects and JetStream's defaults otherwise (file storage, one replica,
// a 2 minute duplicate window); with no subjects given a missing stream is an error. An
// existing stream is never changed: if it does not capture one of subjects, EnsureStream
// says which and leaves the fix to its owner. Several processes may call it at once.
func (p *Publisher) EnsureStream(ctx context.Context, name string, subjects []string) error {
	if name == "" {
		return errors.New("outboxnats: EnsureStream: empty stream name")
	}
	for _, s := range subjects {
		if s == "" || strings.ContainsAny(s, " \t\r\n") {
			return fmt.Errorf("outboxnats: EnsureStream %q: invalid subject filter %q", name, s)
		}
	}
	info, err := p.streamInfo(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if len(subjects) == 0 {
			return fmt.Errorf("outboxnats: JetStream stream %q does not exist: create it (nats stream add %s --subjects ...) or give EnsureStream its subjects", name, name)
		}
		_, err = p.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects})
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("outboxnats: create JetStream stream %q with subjects %q: %w", name, subjects, err)
		}
		// Someone else created it meanwhile, perhaps differently: check what is there.
		info, err = p.streamInfo(ctx, name)
	}
	if err != nil {
		return fmt.Errorf("outboxnats: look up JetStream stream %q: %w", name, err)
	}
	for _, s := range subjects {
		if !capturedBy(info.Config.Subjects, s) {
			return fmt.Errorf("outboxnats: JetStream stream %q exists but does not capture %q (its subjects are %q): add the subject to the stream or use another stream name",
				name, s, info.Config.Subjects)
		}
	}
	return nil
}

func (p *Publisher) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	s, err := p.js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

func capturedBy(filters []string, subject string) bool {
	for _, f := range filters {
		if covers(f, subject) {
			return true
		}
	}
	return false
}

// CheckSubject returns a *NoStreamError (errors.Is(err, ErrNoStream)) if no JetStream
// stream captures subject, another error if it cannot tell, and nil otherwise. Run it at
// start-up for the subjects the publisher will use (see Publisher.Subject): a missing
// stream otherwise shows only as outages when the relay publishes.
func (p *Publisher) CheckSubject(ctx context.Context, subject string) error {
	if reason := checkSubject(subject); reason != "" {
		return fmt.Errorf("outboxnats: invalid subject %q: %s", subject, reason)
	}
	_, err := p.js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return &NoStreamError{Subject: subject}
	default:
		return fmt.Errorf("outboxnats: find the JetStream stream of subject %q: %w", subject, err)
	}
}
