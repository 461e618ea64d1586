package outbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDeliveryID(t *testing.T) {
	for _, tc := range []struct {
		headers  map[string]string
		brokerID string
		want     string
	}{
		{map[string]string{HeaderID: "id", HeaderDedupKey: "dk"}, "b", "id"},
		{map[string]string{HeaderDedupKey: "dk"}, "b", "dk"},
		{nil, "b", "b"},
	} {
		if got := DeliveryID(tc.headers, tc.brokerID, "d", []byte("x")); got != tc.want {
			t.Errorf("DeliveryID(%v, %q) = %q, want %q", tc.headers, tc.brokerID, got, tc.want)
		}
	}
	a := DeliveryID(nil, "", "orders", []byte("x"))
	if a != DeliveryID(map[string]string{}, "", "orders", []byte("x")) || a == DeliveryID(nil, "", "other", []byte("x")) || len(a) != len("sha256:")+64 {
		t.Errorf("fallback id %q is not a stable hash of destination and payload", a)
	}
	d := NewDelivery(nil, "", "orders", nil, 0)
	if d.ID == "" || d.Attempt != 1 || d.Headers == nil {
		t.Errorf("NewDelivery with nothing: %+v", d)
	}
}

func TestRetryPermanent(t *testing.T) {
	base := errors.New("db down")
	r := Retry(base, 3*time.Second)
	if !errors.Is(r, base) || RetryDelay(r, time.Second) != 3*time.Second || IsPermanent(r) {
		t.Errorf("Retry: %v", r)
	}
	if RetryDelay(base, time.Second) != time.Second {
		t.Error("RetryDelay of a plain error is not the default")
	}
	p := Permanent(base)
	if !errors.Is(p, base) || !IsPermanent(p) || !IsPermanent(fmtWrap(p)) {
		t.Errorf("Permanent: %v", p)
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("ctx"), err) }

func TestHandlerContext(t *testing.T) {
	d := NewDelivery(map[string]string{"Traceparent": "00-a-b-01"}, "", "x", nil, 1)
	if got := TraceparentFromContext(HandlerContext(context.Background(), d)); got != "00-a-b-01" {
		t.Fatalf("traceparent %q", got)
	}
	if got := TraceparentFromContext(HandlerContext(context.Background(), NewDelivery(nil, "", "x", nil, 1))); got != "" {
		t.Fatalf("traceparent %q from no header", got)
	}
}
