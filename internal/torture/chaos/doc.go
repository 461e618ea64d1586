// Package chaos holds the torture runs of issue 7 (tests only): the seeded workload of
// package torture writes through the real Writer, relays run as child processes (this
// test binary, re-executed) and publish to a real broker, the nemesis (package
// torture/nemesis) injects faults meanwhile, then everything is healed, the outbox
// drains, the broker is read back completely and the checker prints one summary line.
//
// OUTBOX_TORTURE_SEED sets the seed (default random; every run logs it), and
// OUTBOX_TORTURE_ARTIFACTS names a directory that keeps nemesis.jsonl and, on failure,
// history.jsonl (default: the test's temporary directory).
package chaos
