//! ZooKeeper's numbers: operation codes (`ZooDefs.OpCode`), error codes
//! (`KeeperException.Code`), create modes, watch kinds and event types.

/// Operation codes, as `ZooDefs.OpCode` numbers them.
pub mod op {
    pub const NOTIFICATION: i32 = 0;
    pub const CREATE: i32 = 1;
    pub const DELETE: i32 = 2;
    pub const EXISTS: i32 = 3;
    pub const GET_DATA: i32 = 4;
    pub const SET_DATA: i32 = 5;
    pub const GET_ACL: i32 = 6;
    pub const SET_ACL: i32 = 7;
    pub const GET_CHILDREN: i32 = 8;
    pub const SYNC: i32 = 9;
    pub const PING: i32 = 11;
    pub const GET_CHILDREN2: i32 = 12;
    pub const CHECK: i32 = 13;
    pub const MULTI: i32 = 14;
    pub const CREATE2: i32 = 15;
    pub const RECONFIG: i32 = 16;
    pub const CHECK_WATCHES: i32 = 17;
    pub const REMOVE_WATCHES: i32 = 18;
    pub const CREATE_CONTAINER: i32 = 19;
    pub const DELETE_CONTAINER: i32 = 20;
    pub const CREATE_TTL: i32 = 21;
    pub const MULTI_READ: i32 = 22;
    pub const AUTH: i32 = 100;
    pub const SET_WATCHES: i32 = 101;
    pub const SASL: i32 = 102;
    pub const GET_EPHEMERALS: i32 = 103;
    pub const GET_ALL_CHILDREN_NUMBER: i32 = 104;
    pub const SET_WATCHES2: i32 = 105;
    pub const ADD_WATCH: i32 = 106;
    pub const WHO_AM_I: i32 = 107;
    pub const CREATE_SESSION: i32 = -10;
    pub const CLOSE_SESSION: i32 = -11;
    pub const ERROR: i32 = -1;

    /// ZooKeeper's name of an operation (as its logs and `mntr` give it),
    /// for logs and counters.
    pub fn name(op: i32) -> &'static str {
        match op {
            NOTIFICATION => "notification",
            CREATE => "create",
            DELETE => "delete",
            EXISTS => "exists",
            GET_DATA => "getData",
            SET_DATA => "setData",
            GET_ACL => "getACL",
            SET_ACL => "setACL",
            GET_CHILDREN => "getChildren",
            SYNC => "sync",
            PING => "ping",
            GET_CHILDREN2 => "getChildren2",
            CHECK => "check",
            MULTI => "multi",
            CREATE2 => "create2",
            RECONFIG => "reconfig",
            CHECK_WATCHES => "checkWatches",
            REMOVE_WATCHES => "removeWatches",
            CREATE_CONTAINER => "createContainer",
            DELETE_CONTAINER => "deleteContainer",
            CREATE_TTL => "createTTL",
            MULTI_READ => "multiRead",
            AUTH => "auth",
            SET_WATCHES => "setWatches",
            SASL => "sasl",
            GET_EPHEMERALS => "getEphemerals",
            GET_ALL_CHILDREN_NUMBER => "getAllChildrenNumber",
            SET_WATCHES2 => "setWatches2",
            ADD_WATCH => "addWatch",
            WHO_AM_I => "whoAmI",
            CREATE_SESSION => "createSession",
            CLOSE_SESSION => "closeSession",
            ERROR => "error",
            _ => "unknown",
        }
    }
}

/// Error codes, as `KeeperException.Code` numbers them.
pub mod err {
    pub const OK: i32 = 0;
    pub const SYSTEM_ERROR: i32 = -1;
    pub const RUNTIME_INCONSISTENCY: i32 = -2;
    pub const MARSHALLING_ERROR: i32 = -5;
    pub const UNIMPLEMENTED: i32 = -6;
    pub const BAD_ARGUMENTS: i32 = -8;
    pub const API_ERROR: i32 = -100;
    pub const NO_NODE: i32 = -101;
    pub const NO_AUTH: i32 = -102;
    pub const BAD_VERSION: i32 = -103;
    pub const NO_CHILDREN_FOR_EPHEMERALS: i32 = -108;
    pub const NODE_EXISTS: i32 = -110;
    pub const NOT_EMPTY: i32 = -111;
    pub const SESSION_EXPIRED: i32 = -112;
    pub const INVALID_ACL: i32 = -114;
    pub const AUTH_FAILED: i32 = -115;
    pub const SESSION_MOVED: i32 = -118;
    pub const NOT_READ_ONLY: i32 = -119;
    pub const NO_WATCHER: i32 = -121;
    pub const RECONFIG_DISABLED: i32 = -123;
    pub const QUOTA_EXCEEDED: i32 = -125;
    pub const THROTTLED_OP: i32 = -127;
}

/// The `xid`s ZooKeeper reserves for frames that answer no request of the
/// client's own numbering.
pub mod xid {
    /// A watch notification.
    pub const NOTIFICATION: i32 = -1;
    pub const PING: i32 = -2;
    pub const AUTH: i32 = -4;
    pub const SET_WATCHES: i32 = -8;
}

/// Create modes (`CreateMode`'s flags).
pub mod mode {
    pub const PERSISTENT: i32 = 0;
    pub const EPHEMERAL: i32 = 1;
    pub const PERSISTENT_SEQUENTIAL: i32 = 2;
    pub const EPHEMERAL_SEQUENTIAL: i32 = 3;
    pub const CONTAINER: i32 = 4;
    pub const PERSISTENT_WITH_TTL: i32 = 5;
    pub const PERSISTENT_SEQUENTIAL_WITH_TTL: i32 = 6;
}

/// Watcher event types (`Watcher.Event.EventType`).
pub mod event {
    pub const NONE: i32 = -1;
    pub const NODE_CREATED: i32 = 1;
    pub const NODE_DELETED: i32 = 2;
    pub const NODE_DATA_CHANGED: i32 = 3;
    pub const NODE_CHILDREN_CHANGED: i32 = 4;
    /// The client's state in every notification: connected.
    pub const STATE_SYNC_CONNECTED: i32 = 3;
}

/// Watch kinds of check watches and remove watches
/// (`Watcher.WatcherType`), and add watch's modes.
pub mod watch {
    pub const CHILDREN: i32 = 1;
    pub const DATA: i32 = 2;
    pub const ANY: i32 = 3;
    pub const PERSISTENT: i32 = 4;
    pub const PERSISTENT_RECURSIVE: i32 = 5;
    /// `AddWatchMode.PERSISTENT`.
    pub const MODE_PERSISTENT: i32 = 0;
    /// `AddWatchMode.PERSISTENT_RECURSIVE`.
    pub const MODE_PERSISTENT_RECURSIVE: i32 = 1;
}

/// ACL permissions (`ZooDefs.Perms`).
pub mod perms {
    pub const READ: i32 = 1;
    pub const WRITE: i32 = 2;
    pub const CREATE: i32 = 4;
    pub const DELETE: i32 = 8;
    pub const ADMIN: i32 = 16;
    pub const ALL: i32 = 31;
}
