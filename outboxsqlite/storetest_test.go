package outboxsqlite_test

import (
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testsql"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

func TestStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		t.Parallel() // each test has a database file of its own
		b := setup(t)
		return testsql.Outbox(b.drv, b.db, b.w)
	})
}
