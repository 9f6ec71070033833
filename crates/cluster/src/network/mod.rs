//! The replicated log's traffic between members, over Baton's own framed
//! TCP on each member's peer port.
//!
//! # Format
//! ```text
//! every frame: length u32 (big-endian), then that many bytes of bincode
//! a connection opens with Hello { magic "BATNPEER", version 5, from: id }
//! then the dialing member sends requests and the other answers each, in
//! order, on the same connection; after the Hello every frame is
//!   call id u64 (big-endian), then the bincode of a request or an answer
//! and an answer carries the id of the request it answers:
//!   Append(AppendEntriesRequest)   -> Append(Result<AppendEntriesResponse>)
//!   Vote(VoteRequest)              -> Vote(Result<VoteResponse>)
//!   Snapshot(InstallSnapshotRequest, one chunk)
//!                                  -> Snapshot(Result<InstallSnapshotResponse>)
//!   Status                         -> Status(MemberStatus)
//!   Change(add or remove a member) -> Changed(Result<message, error>)
//!                                     (asked of the leader, by an operator)
//!   Added { id, at }               -> Added(Result<(), error>)
//!                                     (the leader to a member being added)
//!   WentBack { held }              -> WentBack(Result<(), error>)
//!                                     (the leader to a member whose log lost
//!                                     entries it had acknowledged)
//!   Serve { change, heard, confirm, applied }
//!                                  -> Served(Result<{ applied index?,
//!                                     sessions refused,
//!                                     sessions not heard }, error>)
//!                                     (a follower that serves clients to
//!                                     its leader: see `serving`)
//! ```
//! A member dials another when it first needs to and again after any
//! failure; connections of short-lived clients are kept for the next ones.
//! Every call has the deadline openraft gives it, and a member that cannot
//! be reached or does not answer in time is reported unreachable, so that
//! openraft backs off before trying again.
//!
//! A connection is reused only after a whole exchange: a call given up
//! between writing its request and reading its answer (openraft times its
//! calls out on its own, by dropping them) takes its connection with it,
//! and an answer whose id or kind is not the one asked for ends the
//! connection. One answer read in place of another would make the leader
//! count a member as holding entries it never stored.
//!
//! # A member whose data went back
//! A leader remembers, for the time it leads, how far each member said it
//! holds the log. A member that then answers that it lacks an entry at or
//! below that point has lost entries it stored and acknowledged: it was
//! started from an old copy of its data directory (a file-system backup
//! put back, a disk snapshot). Its acknowledgements may be part of a
//! majority that committed entries only the leader still holds, so the
//! leader does not count on it: it tells the member, which stops with the
//! procedure to follow (remove it, wipe it, add it again), and it keeps
//! the member unreachable meanwhile rather than hand the answer to the
//! consensus engine (which would stop the leader itself: a member of a
//! 3-member cluster put back from a copy then took its leader down, and
//! with it the only copy of entries the cluster had acknowledged).
//!
//! - `wire.rs`: the messages and their framing;
//! - `tls.rs`: TLS between members;
//! - `dial.rs`: calling other members (openraft's network, and the calls of
//!   operators and of a leader);
//! - `answering.rs`, `answer.rs`: the peer listener and what it answers with.

mod answer;
mod answering;
mod dial;
mod tls;
mod wire;

pub use answer::serve;
pub use answering::Answering;
pub use dial::{
    ask_change, status_of, tell_added, CallError, Failed, Held, LeaderLink, Network, Peer,
    StatusLink,
};
pub use tls::PeerTls;
pub use wire::{Change, MemberStatus, Served};

#[cfg(test)]
mod tests;
