//! Notifications between replicas: a write that another replica must act on
//! (an event appended, an approval decided, a cancel requested) is announced
//! to every process on the store.
//!
//! PostgreSQL carries them with `LISTEN/NOTIFY` on [`PG_CHANNEL`], sent in the
//! same transaction as the write (a notification leaves only when its write
//! commits). SQLite and the memory store serve one process: an in-process
//! broadcast, shared by every store opened on the same SQLite file.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use tokio::sync::broadcast;

/// The PostgreSQL channel the conversation store notifies on.
pub const PG_CHANNEL: &str = "omicos_sessions";

/// How many notices a slow subscriber may fall behind before it is told it lagged.
const CAPACITY: usize = 4096;

/// A change in the store that a replica may have to act on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Notice {
    /// An event was appended to a session's log.
    Event {
        /// Session id.
        session: String,
        /// The new event's seq.
        seq: u64,
    },
    /// A decision was recorded for a pending approval.
    Approval {
        /// Session id.
        session: String,
        /// The waiting call.
        call_id: String,
        /// The `omicos.v1.Decision` value.
        decision: i32,
        /// With ALLOW_SESSION: the allow rule the user answered with (empty: none).
        #[serde(default, skip_serializing_if = "String::is_empty")]
        rule: String,
    },
    /// A cancel was requested for the turn held by `owner`.
    Cancel {
        /// Session id.
        session: String,
        /// The lease owner of the turn to cancel.
        owner: String,
    },
    /// Notices may have been missed (the listener reconnected, or this
    /// subscriber lagged): re-read from the store what you are waiting for.
    Resync,
}

impl Notice {
    /// The session the notice is about (None for [`Notice::Resync`]).
    pub fn session(&self) -> Option<&str> {
        match self {
            Notice::Event { session, .. }
            | Notice::Approval { session, .. }
            | Notice::Cancel { session, .. } => Some(session),
            Notice::Resync => None,
        }
    }

    /// The notification payload (JSON, well under PostgreSQL's 8000 bytes for sane ids).
    pub fn payload(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a payload; None when it is not a notice (another writer on the channel).
    pub fn parse(payload: &str) -> Option<Notice> {
        serde_json::from_str(payload).ok()
    }
}

/// Where notices are published and subscribed to.
#[derive(Clone, Debug)]
pub struct Notices {
    tx: broadcast::Sender<Notice>,
}

impl Default for Notices {
    fn default() -> Self {
        Self::new()
    }
}

impl Notices {
    /// A new, private bus.
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(CAPACITY).0,
        }
    }

    /// The bus shared by every store of this process opened on `key` (a SQLite file).
    pub fn shared(key: &str) -> Self {
        static BUSES: OnceLock<Mutex<HashMap<String, Notices>>> = OnceLock::new();
        BUSES
            .get_or_init(Default::default)
            .lock()
            .expect("notice buses")
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    /// Publishes a notice to this process's subscribers.
    pub fn publish(&self, n: Notice) {
        let _ = self.tx.send(n);
    }

    /// A new subscriber.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_foreign_payloads_are_ignored() {
        for n in [
            Notice::Event {
                session: "s".into(),
                seq: 7,
            },
            Notice::Approval {
                session: "s".into(),
                call_id: "c\"1".into(),
                decision: 2,
                rule: "shell(git *)".into(),
            },
            Notice::Cancel {
                session: "s".into(),
                owner: "i:t".into(),
            },
            Notice::Resync,
        ] {
            assert_eq!(Notice::parse(&n.payload()), Some(n));
        }
        assert_eq!(Notice::parse("hello"), None);
        assert_eq!(Notice::parse(r#"{"k":"other"}"#), None);
    }

    #[test]
    fn stores_on_one_file_share_a_bus() {
        let a = Notices::shared("/tmp/x.db");
        let b = Notices::shared("/tmp/x.db");
        let other = Notices::shared("/tmp/y.db");
        let mut rx = b.subscribe();
        let mut rx_other = other.subscribe();
        a.publish(Notice::Resync);
        assert_eq!(rx.try_recv().unwrap(), Notice::Resync);
        assert!(rx_other.try_recv().is_err());
    }
}
