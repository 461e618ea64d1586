package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DeadLetter is a message that Consume dead-lettered, as its copy is stored in the stream
// that captures ConsumerConfig.DeadLetterSubject.
type DeadLetter struct {
	Seq      uint64    // sequence in the dead-letter stream
	Time     time.Time // when it was dead-lettered
	ID       string    // the Outbox-Id header
	Subject  string    // the subject it was consumed from
	Stream   string    // the stream it was consumed from
	Reason   string    // the handler's last error
	Attempts int       // deliveries before it was dead-lettered
	Headers  nats.Header
	Payload  []byte
}

// ListDead returns the dead letters in stream, oldest first, at most limit of them (0
// means all).
func ListDead(ctx context.Context, js jetstream.JetStream, stream string, limit int) ([]DeadLetter, error) {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("outboxnats: read dead-letter stream %s: %w", stream, err)
	}
	var out []DeadLetter
	for limit <= 0 || len(out) < limit {
		want := 256
		if limit > 0 {
			want = min(want, limit-len(out))
		}
		batch, err := cons.FetchNoWait(want)
		if err != nil {
			return nil, fmt.Errorf("outboxnats: read dead-letter stream %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			out = append(out, deadLetter(m))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("outboxnats: read dead-letter stream %s: %w", stream, err)
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}

func deadLetter(m jetstream.Msg) DeadLetter {
	h := m.Headers()
	d := DeadLetter{
		ID: h.Get("Outbox-Id"), Subject: h.Get(HeaderDeadSubject), Stream: h.Get(HeaderDeadStream),
		Reason: h.Get(HeaderDeadReason), Headers: h, Payload: m.Data(),
	}
	d.Attempts, _ = strconv.Atoi(h.Get(HeaderDeadAttempts))
	if md, err := m.Metadata(); err == nil {
		d.Seq, d.Time = md.Sequence.Stream, md.Timestamp
	}
	return d
}

// ReplayDead publishes the dead letters of stream with the given sequences back to the
// subjects they were consumed from, with their original headers and payload, and
// deletes each from the dead-letter stream once JetStream confirmed its new copy. It
// returns how many it replayed; on an error, those replayed before it stay replayed.
//
// The copy's Nats-Msg-Id is new (the original id is still within the stream's duplicate
// window if the message died quickly, and JetStream would drop the copy as a duplicate);
// its Outbox-Id header is the original one, so consumers that handled it before, through
// an inbox, skip it.
func ReplayDead(ctx context.Context, js jetstream.JetStream, stream string, seqs []uint64) (int, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("outboxnats: dead-letter stream %s: %w", stream, err)
	}
	for i, seq := range seqs {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			return i, fmt.Errorf("outboxnats: dead letter %d of %s: %w", seq, stream, err)
		}
		subject := raw.Header.Get(HeaderDeadSubject)
		if subject == "" {
			return i, fmt.Errorf("outboxnats: dead letter %d of %s has no %s header: not written by Consume", seq, stream, HeaderDeadSubject)
		}
		msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: raw.Data}
		for k, vs := range raw.Header {
			switch k {
			case HeaderDeadReason, HeaderDeadStream, HeaderDeadSubject, HeaderDeadAttempts, jetstream.MsgIDHeader:
				continue
			}
			msg.Header[k] = vs
		}
		msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("replay:%s:%d", stream, seq))
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return i, fmt.Errorf("outboxnats: replay dead letter %d to %s: %w", seq, subject, err)
		}
		if err := st.DeleteMsg(ctx, seq); err != nil {
			return i + 1, fmt.Errorf("outboxnats: dead letter %d replayed but not deleted from %s (replaying it again publishes a second copy): %w", seq, stream, err)
		}
	}
	return len(seqs), nil
}
