// Package chaos runs the torture runs of the correctness suite: the seeded workload of
// package torture writes through the real Writer, relays run as processes of their own
// (the running executable, started again: see IsRelay) and publish to a real broker on a
// private server, the nemesis (package torture/nemesis) injects faults meanwhile, then
// everything is healed, the outbox drains, the broker is read back completely and the
// checker reports.
//
// The tests of this package run it inside the test command; `outbox-torture` (cmd/outbox-torture) runs it on
// demand. In the tests, OUTBOX_TORTURE_SEED sets the seed (default random; every run logs
// it), and OUTBOX_TORTURE_ARTIFACTS names a directory that keeps nemesis.jsonl and, on
// failure, history.jsonl (default: a temporary directory).
package chaos
