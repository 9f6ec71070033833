//! Four-letter words: a connection whose first four bytes are one of these
//! (rather than a frame's length) asks for the server's status in text, and
//! is closed once answered.

/// The words Baton answers, as ZooKeeper names them.
pub const WORDS: [&str; 9] = [
    "ruok", "srvr", "stat", "mntr", "cons", "wchs", "isro", "conf", "envi",
];

/// The words ZooKeeper knows but Baton does not answer (they change the
/// server, or report what Baton does not keep).
pub const UNANSWERED: [&str; 8] = [
    "crst", "srst", "dump", "wchc", "wchp", "dirs", "gtmk", "stmk",
];

/// The word a connection's first four bytes spell, if they spell one
/// ZooKeeper knows.
pub fn word(first: [u8; 4]) -> Option<&'static str> {
    WORDS
        .iter()
        .chain(UNANSWERED.iter())
        .find(|w| w.as_bytes() == first)
        .copied()
}
