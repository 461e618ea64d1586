// Package outboxdriver is the seam between the outbox and the databases it runs on: what
// a store implements for the relay (Store, and where the database allows, Listener,
// Maintainer and Recycler), for writers and consumers (WriteDriver, InboxDriver,
// VersionDriver, InboxCleaner), and for operators (Admin, with the status and
// dead-letter types it returns).
//
// Applications do not need this package: they hand a store driver (outboxpgx,
// outboxsql, outboxmysql, outboxsqlite) to outbox.NewWriter and outbox.NewRelay.
// Operators' tools (the outbox command, dashboards) use Admin.
//
// Stability: these interfaces grow with the relay, and a method may be added in a minor
// release. A store kept outside this module builds against the version it was written
// for; the store suite (outboxtest/storetest) tells whether it keeps the contract.
package outboxdriver
