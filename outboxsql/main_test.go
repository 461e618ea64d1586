package outboxsql_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The relay runs goroutines and database/sql keeps one per *sql.DB: all must be gone
// when the tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
