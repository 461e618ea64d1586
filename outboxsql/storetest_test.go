package outboxsql_test

import (
	"testing"

	"github.com/outboxkit/outbox/internal/testinfra/testenv"
	"github.com/outboxkit/outbox/internal/testinfra/testsql"
	"github.com/outboxkit/outbox/outboxtest/storetest"
)

// The store conformance suite, once per database/sql driver: the store binds every
// parameter as a plain value (arrays as literals), so each driver must pass it whole.

func TestStoreConformancePgxStdlib(t *testing.T) { runStoreConformance(t, "pgx") }

func TestStoreConformanceLibPQ(t *testing.T) { runStoreConformance(t, "postgres") }

func runStoreConformance(t *testing.T, driverName string) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		b := setupUnmigrated(t, driverName)
		if _, err := b.drv.MigrateUp(testenv.Context(t), 0); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		return testsql.Outbox(b.drv, b.db, b.w)
	})
}
