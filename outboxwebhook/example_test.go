package outboxwebhook_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxwebhook"
)

func Example() {
	secret := []byte("32 random bytes, shared with the receiver")

	// The receiver: VerifyHandler checks the signature; the handler stores the event
	// (here: prints it), deduplicating on Idempotency-Key, before it answers 2xx.
	receiver := httptest.NewServer(http.MaxBytesHandler(outboxwebhook.VerifyHandler([][]byte{secret}, 0,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			fmt.Println(r.URL.Path, r.Header.Get("Idempotency-Key"), r.Header.Get("Outbox-Event-Type"), string(body))
			w.WriteHeader(http.StatusNoContent)
		})), 4<<20))
	defer receiver.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := outboxwebhook.Dial(ctx, receiver.URL+"/outbox", outboxwebhook.Config{Secrets: [][]byte{secret}})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// The relay does this (outbox.NewRelay(store, pub, ...)); here by hand.
	msg := &outbox.Message{ID: outbox.NewID(), Topic: "orders", Key: "order-42", EventType: "order.placed",
		DedupKey: "order-42-placed", Payload: []byte(`{"id":42}`), ContentType: outbox.ContentTypeJSON}
	errs := pub.Publish(ctx, []*outbox.Message{msg})
	fmt.Println("confirmed:", errs == nil)
	// Output:
	// /outbox/orders order-42-placed order.placed {"id":42}
	// confirmed: true
}

// ExampleVerify checks a webhook by hand, in a handler that does more than VerifyHandler.
func ExampleVerify() {
	secrets := [][]byte{[]byte("32 random bytes, shared with the receiver")}
	handler := func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 4<<20)
		body, err := outboxwebhook.Verify(r, secrets, 5*time.Minute)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized) // the publisher pauses
			return
		}
		// Store the event, once per Outbox-Id (outbox.Inbox does it in the same
		// transaction), then answer 2xx.
		fmt.Printf("verified %s\n", body)
		w.WriteHeader(http.StatusNoContent)
	}

	// A request as a Publisher signs it.
	body := []byte(`{"id":42}`)
	r := httptest.NewRequest(http.MethodPost, "/outbox/orders", bytes.NewReader(body))
	id := outbox.NewID().String()
	r.Header.Set(outboxwebhook.HeaderIdempotencyKey, "order-42-placed")
	r.Header.Set(outbox.HeaderID, id)
	r.Header.Set(outboxwebhook.HeaderSignature, outboxwebhook.Sign(secrets, outboxwebhook.Signed{
		Time: time.Now(), Method: http.MethodPost, Target: "/outbox/orders", ID: id, Key: "order-42-placed", Body: body}))
	w := httptest.NewRecorder()
	handler(w, r)
	fmt.Println(w.Code)
	// Output:
	// verified {"id":42}
	// 204
}
