// Package testenv lets the fixtures that tests use (private servers, proxies, database
// schemas) also serve code that runs outside `go test`: the `outbox-torture` command.
// The fixtures take a TB, which *testing.T satisfies; Run supplies one to other code.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/outboxkit/outbox"
)

// TB is the part of testing.TB that fixtures use.
type TB interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

// failure is what Fatal panics with in a standalone TB; Run recovers it.
type failure struct{ msg string }

// Run calls f with a TB whose Logf goes to logf, whose Fatal stops f, and whose cleanups
// and temporary directories are undone, last first, when f returns. It returns an error
// if f failed (Fatal or Errorf), or panicked with a Fatal from its own goroutine.
func Run(name string, logf func(format string, args ...any), f func(TB)) (err error) {
	s := &standalone{name: name, logf: logf}
	defer func() {
		if r := recover(); r != nil {
			fl, ok := r.(failure)
			if !ok {
				panic(r)
			}
			s.fail(fl.msg)
		}
		s.cleanup()
		s.mu.Lock()
		defer s.mu.Unlock()
		err = errors.Join(s.errs...)
	}()
	f(s)
	return nil
}

type standalone struct {
	name string
	logf func(format string, args ...any)

	mu       sync.Mutex
	errs     []error
	cleanups []func()
}

func (s *standalone) Helper()      {}
func (s *standalone) Name() string { return s.name }

func (s *standalone) Logf(format string, args ...any) {
	if s.logf != nil {
		s.logf(format, args...)
	}
}

func (s *standalone) fail(msg string) {
	s.mu.Lock()
	s.errs = append(s.errs, errors.New(msg))
	s.mu.Unlock()
}

func (s *standalone) Errorf(format string, args ...any) { s.fail(fmt.Sprintf(format, args...)) }

func (s *standalone) Fatal(args ...any) { panic(failure{fmt.Sprint(args...)}) }

func (s *standalone) Fatalf(format string, args ...any) {
	panic(failure{fmt.Sprintf(format, args...)})
}

func (s *standalone) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errs) > 0
}

func (s *standalone) Cleanup(f func()) {
	s.mu.Lock()
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}

func (s *standalone) TempDir() string {
	dir, err := os.MkdirTemp("", "outbox-"+s.name+"-")
	if err != nil {
		s.Fatalf("testenv: temporary directory: %v", err)
	}
	s.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// cleanup runs the cleanups, last registered first, each even if another panics.
func (s *standalone) cleanup() {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			return
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					if fl, ok := r.(failure); ok {
						s.fail(fl.msg)
						return
					}
					s.fail(fmt.Sprint("panic in cleanup: ", r))
				}
			}()
			f()
		}()
	}
}

// PublishedAll reports whether errs, an outbox.Publisher's answer to a batch, says that
// every message was confirmed (a nil slice). Otherwise it reports each message's error
// with t.Errorf and returns false: it may be called from any goroutine.
func PublishedAll(t TB, errs []error) bool {
	t.Helper()
	if errs == nil {
		return true
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	t.Errorf("Publish returned a non-nil slice (%d entries)", len(errs))
	return false
}

// RequirePublishedAll is PublishedAll that ends the test when a message was not
// confirmed; call it from the test's goroutine.
func RequirePublishedAll(t TB, errs []error) {
	t.Helper()
	if !PublishedAll(t, errs) {
		t.Fatal("not every message was confirmed")
	}
}

// RequireAllOutages fails t unless errs, an outbox.Publisher's answer to a batch of n,
// holds an outage for every message (outbox.IsOutage): what a publisher must answer when
// it cannot tell whether the broker stored them.
func RequireAllOutages(t TB, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("errs = %v, want %d outages", errs, n)
	}
	for i, err := range errs {
		if !outbox.IsOutage(err) {
			t.Errorf("message %d: %v, want an outage", i, err)
		}
	}
}

// Message returns a binary message with a fresh id and a dedup key of its own, as the
// broker publishers' tests send them.
func Message(topic, key string, payload []byte) *outbox.Message {
	id := outbox.NewID()
	return &outbox.Message{
		ID:          id,
		Topic:       topic,
		Key:         key,
		Payload:     payload,
		ContentType: outbox.ContentTypeBinary,
		DedupKey:    "dedup-" + id.String(),
	}
}
