package pgsql

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// This file is the part of outboxdriver.Store that is not SQL but must behave the same in
// every PostgreSQL driver: the parameters of Complete and the reading of its result, and
// the decoding of the columns of ReadColumns.

// CompleteArgs are the array parameters of Complete ($2..$8), never nil (pgx sends a nil
// slice as NULL, not an empty array).
type CompleteArgs struct {
	Tokens           []int64  // $2: every token the outcomes carry, once
	Published        []int64  // $3
	RetrySeqs        []int64  // $4
	RetryErrors      []string // $5
	RetryDelayMillis []int64  // $6
	DeadSeqs         []int64  // $7
	DeadErrors       []string // $8
}

// NewCompleteArgs sorts c's outcomes into Complete's parameters.
func NewCompleteArgs(c outboxdriver.Completion) CompleteArgs {
	a := CompleteArgs{
		Tokens: []int64{}, Published: make([]int64, len(c.Published)),
		RetrySeqs: []int64{}, RetryErrors: []string{}, RetryDelayMillis: []int64{},
		DeadSeqs: []int64{}, DeadErrors: []string{},
	}
	seen := map[int64]bool{}
	token := func(t int64) {
		if !seen[t] {
			seen[t] = true
			a.Tokens = append(a.Tokens, t)
		}
	}
	for i, o := range c.Published {
		a.Published[i] = o.Seq
		token(o.Token)
	}
	for _, f := range c.Failed {
		token(f.Token)
		msg := ErrorText(f.Error)
		if f.Dead {
			a.DeadSeqs, a.DeadErrors = append(a.DeadSeqs, f.Seq), append(a.DeadErrors, msg)
		} else {
			a.RetrySeqs, a.RetryErrors = append(a.RetrySeqs, f.Seq), append(a.RetryErrors, msg)
			a.RetryDelayMillis = append(a.RetryDelayMillis, f.Delay.Milliseconds())
		}
	}
	return a
}

// ErrorText makes a publish error storable as text: PostgreSQL text holds no NUL and
// only valid UTF-8.
func ErrorText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
}

// Refused returns the seqs of c that are not among applied (the seqs Complete returned),
// published ones first, in c's order.
func Refused(c outboxdriver.Completion, applied []int64) []int64 {
	if len(applied) == len(c.Published)+len(c.Failed) {
		return nil
	}
	ok := make(map[int64]bool, len(applied))
	for _, s := range applied {
		ok[s] = true
	}
	var refused []int64
	for _, o := range c.Published {
		if !ok[o.Seq] {
			refused = append(refused, o.Seq)
		}
	}
	for _, f := range c.Failed {
		if !ok[f.Seq] {
			refused = append(refused, f.Seq)
		}
	}
	return refused
}

// DecodeHeaders parses the headers column as ReadColumns reads it (the text of a JSON
// object); "{}" is no headers, a nil map. seq names the message in the error.
func DecodeHeaders(seq int64, text []byte) (map[string]string, error) {
	if len(text) <= 2 {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(text, &h); err != nil {
		return nil, fmt.Errorf("message %d: headers: %w", seq, err)
	}
	return h, nil
}

// Tokens returns the tokens of ls.
func Tokens(ls []outboxdriver.Lease) []int64 {
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l.Token
	}
	return out
}

// ErrNoPartition is wrapped by Complete's error when the published history has no
// partition for the time an outcome is recorded: the messages stay pending (nothing is
// lost) until the day's partition exists.
var ErrNoPartition = errors.New("the published history has no partition for today (UTC): " +
	"run 'outbox partitions create'; relays create 7 days ahead themselves, so check that their maintenance runs (see docs/operations.md)")

// CompleteError wraps an error of Complete's statement, naming a missing partition:
// check_violation is the only constraint the statement can break, since the outbox tables
// have no CHECK constraint of their own; a partition bound is one.
func CompleteError(err error) error {
	if sqlState(err) == "23514" {
		return fmt.Errorf("record outcomes: %w: %w", ErrNoPartition, err)
	}
	return fmt.Errorf("record outcomes: %w", err)
}
