// Package outboxtype holds the vocabulary that applications, stores and publishers
// share: Message and its ID, the header names publishers put on the wire, and
// ConfigError. Package outbox declares every name of this package as its own (type
// aliases and constants), so applications import only outbox; store and broker authors
// can import this package without the relay.
package outboxtype
