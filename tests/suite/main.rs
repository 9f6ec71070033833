//! Baton's integration tests against real servers on loopback, in one test
//! binary (one link of the whole workspace instead of one per file). Each
//! module is one area; what they share is the `baton-testkit` crate.

mod auth;
mod bad_input;
mod durability;
mod election;
mod lock;
mod metrics;
mod persistent_watches;
mod pipelining;
mod postgres_fencing;
mod queue_rules;
mod recipes;
mod resume;
mod sequential;
mod sessions;
mod tls;
mod txn;
mod watches;
mod zookeeper;
