//! Baton's replicated mode: a cluster of 3 or 5 members on openraft.
//!
//! This crate is the only one that knows the consensus engine. Each member
//! runs a Baton server built with [`baton_server::Server::member`]; the
//! replicated log feeds its state machine through the server's
//! [`baton_server::Applier`], and the server proposes through the
//! [`baton_server::replicate::Replicator`] this crate implements.

// openraft's error types are large by design (they carry log ids, votes and
// node addresses); its API returns them by value.
#![allow(clippy::result_large_err)]

pub mod admin;
mod barriers;
mod campaign;
mod for_followers;
pub mod joining;
pub mod log_store;
pub mod member;
pub mod network;
mod serving;
#[cfg(test)]
mod sim;
pub mod state_machine;
pub mod types;

pub use member::{ClusterMember, MemberConfig, MemberError};
pub use types::{Member, NodeId};
