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

    /// The notices of one payload: a notice's ([`Notice::payload`]), or
    /// several sessions' new events ([`Notice::event_payloads`]). Empty when
    /// it is neither (another writer on the channel).
    pub fn parse_all(payload: &str) -> Vec<Notice> {
        if let Ok(EventBatch::Events { e }) = serde_json::from_str(payload) {
            return e
                .into_iter()
                .map(|(session, seq)| Notice::Event { session, seq })
                .collect();
        }
        Notice::parse(payload).into_iter().collect()
    }

    /// Payloads announcing each session's last new seq, several sessions to
    /// a payload (each under [`PAYLOAD_MAX`] bytes, PostgreSQL taking up to
    /// 8,000): a batch of events for hundreds of sessions is a few
    /// notifications, not one per session. Each notification costs the
    /// server a queue entry under its notify lock and a message to every
    /// listening replica, and that replica a message to read; one per
    /// session was most of the notifications' cost at 1,000 streams.
    /// A session whose entry alone is over the limit goes in a
    /// [`Notice::Event`] of its own.
    pub fn event_payloads<'a>(last: impl IntoIterator<Item = (&'a str, u64)>) -> Vec<String> {
        let mut out = Vec::new();
        let mut cur = String::from(BATCH_HEAD);
        for (session, seq) in last {
            let entry = serde_json::to_string(&(session, seq)).unwrap_or_default();
            if BATCH_HEAD.len() + entry.len() + BATCH_TAIL.len() > PAYLOAD_MAX {
                let one = Notice::Event {
                    session: session.to_owned(),
                    seq,
                };
                out.push(one.payload());
                continue;
            }
            if cur.len() + 1 + entry.len() + BATCH_TAIL.len() > PAYLOAD_MAX {
                cur.push_str(BATCH_TAIL);
                out.push(std::mem::replace(&mut cur, String::from(BATCH_HEAD)));
            }
            if cur.len() > BATCH_HEAD.len() {
                cur.push(',');
            }
            cur.push_str(&entry);
        }
        if cur.len() > BATCH_HEAD.len() {
            cur.push_str(BATCH_TAIL);
            out.push(cur);
        }
        out
    }
}

/// The most bytes of a batched payload ([`Notice::event_payloads`]).
pub const PAYLOAD_MAX: usize = 7_900;

/// Several sessions' new events in one payload: `{"k":"events","e":[[session, seq], …]}`.
#[derive(Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
enum EventBatch {
    Events { e: Vec<(String, u64)> },
}

const BATCH_HEAD: &str = r#"{"k":"events","e":["#;
const BATCH_TAIL: &str = "]}";

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
        assert!(Notice::parse_all("hello").is_empty());
        assert!(Notice::parse_all(r#"{"k":"other","e":[["s",1]]}"#).is_empty());
        let one = Notice::Cancel {
            session: "s".into(),
            owner: "o".into(),
        };
        assert_eq!(Notice::parse_all(&one.payload()), vec![one]);
    }

    #[test]
    fn event_payloads_carry_every_session_within_the_limit() {
        assert!(Notice::event_payloads([]).is_empty());
        // 1,000 sessions with quotes and backslashes in their ids, and one
        // id too long for a batch: every one comes back once (the order
        // between sessions means nothing).
        let ids: Vec<String> = (0..1000)
            .map(|i| format!("sess-\"{i}\\-{i:0>30}"))
            .collect();
        let long = "x".repeat(PAYLOAD_MAX);
        let mut last: Vec<(&str, u64)> = ids.iter().map(|s| s.as_str()).zip(1..).collect();
        last.insert(500, (long.as_str(), 9));
        let payloads = Notice::event_payloads(last.iter().copied());
        assert!(
            payloads.len() > 1 && payloads.len() < 20,
            "{} payloads",
            payloads.len()
        );
        let mut back = Vec::new();
        for p in &payloads {
            assert!(
                p.len() <= PAYLOAD_MAX || Notice::parse(p).is_some(),
                "{} bytes",
                p.len()
            );
            back.extend(Notice::parse_all(p));
        }
        let key = |n: &Notice| n.session().map(str::to_owned);
        back.sort_by_key(key);
        let mut want: Vec<Notice> = last
            .iter()
            .map(|(s, seq)| Notice::Event {
                session: (*s).to_owned(),
                seq: *seq,
            })
            .collect();
        want.sort_by_key(key);
        assert_eq!(back, want);
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
