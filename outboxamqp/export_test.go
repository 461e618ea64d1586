package outboxamqp

// HeaderFrameSize exposes headerFrameSize to the tests of package outboxamqp_test.
var HeaderFrameSize = headerFrameSize
