//! The registry shared by every runner replica, kept in PostgreSQL.
//!
//! Why PostgreSQL: operators who run replicas already run it (the
//! conversation store lives there), rows with an `expires_at` give heartbeat
//! expiry, and LISTEN/NOTIFY pushes every change to every replica. Each
//! replica keeps the live set in memory ([`Registry`]) and only the registry
//! RPCs (register, heartbeat, deregister: a few a minute per provider) touch
//! the database; routing a tool call never does.
//!
//! - register/heartbeat/deregister write a row and `NOTIFY omicos_registry` in
//!   one transaction;
//! - every replica LISTENs, applies heartbeats and pins from the payload and
//!   re-reads the live set on any other change, after (re)subscribing, and
//!   every `registry_resync` in case a notification was missed;
//! - expired rows are ignored by readers and swept by every replica;
//! - session pins (kernel) are rows too, written after the pin is chosen:
//!   rendezvous hashing makes every replica choose the same instance anyway,
//!   and the row lets a replica that never saw the session tell the model that
//!   its kernel state was lost.

use crate::ownership::{Claim, KeyCheck};
use crate::registry::Registry;
use omicos_proto::{ProviderInstance, ToolSpec};
use serde_json::{Value, json};
use sqlx::Row;
use sqlx::postgres::{PgListener, PgPool};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The notification channel.
pub const CHANNEL: &str = "omicos_registry";

const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE omicos_registry_instances (
    instance_id TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    session_affinity BOOLEAN NOT NULL,
    tools JSONB NOT NULL,
    ttl_ms BIGINT NOT NULL,
    last_seen_ms BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX omicos_registry_instances_expiry ON omicos_registry_instances (expires_at);
CREATE TABLE omicos_registry_pins (
    provider TEXT NOT NULL,
    session_id TEXT NOT NULL,
    instance_id TEXT NOT NULL,
    pinned_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, session_id)
);
"#,
    r#"
CREATE TABLE omicos_registry_owners (
    instance_id TEXT PRIMARY KEY,
    owner_key TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE omicos_registry_tools (
    tool TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"#,
];

/// How long a pin to an instance that is no longer live is kept, so that a
/// session coming back still hears that its state was lost.
const STALE_PIN_KEEP: &str = "7 days";

/// The PostgreSQL side of a shared [`Registry`].
pub struct SharedStore {
    pool: PgPool,
    reload: Notify,
    /// Held from a re-read's first query to its apply: two re-reads (the
    /// follower's and a caller's) apply in the order they read, so an older
    /// snapshot never lands after a newer one (a withdrawn instance would
    /// come back until the next resync).
    loading: tokio::sync::Mutex<()>,
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Not a PostgreSQL URL.
    #[error(
        "registry_store_url: expected postgres://… (or empty for the in-memory registry), got `{0}`"
    )]
    NotPostgres(String),
    /// The database refused.
    #[error("registry store: {0}")]
    Db(#[from] sqlx::Error),
    /// Opening failed.
    #[error("registry store: {0}")]
    Open(#[from] omicos_sqldb::OpenError),
}

impl SharedStore {
    /// Opens `url` and creates the tables when missing.
    pub async fn connect(url: &str) -> Result<Arc<Self>, StoreError> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(StoreError::NotPostgres(url.to_owned()));
        }
        let db = omicos_sqldb::open(
            url,
            omicos_sqldb::OpenOptions {
                what: "registry store",
                expected: "postgres://…",
                foreign_keys: false,
            },
        )
        .await?;
        omicos_sqldb::migrate(
            &db,
            omicos_sqldb::Migrations {
                table: "omicos_registry_schema",
                pg_lock: 0x6f_6d69_6372_6567,
                sqlite: &[],
                pg: MIGRATIONS,
            },
        )
        .await?;
        let omicos_sqldb::Db::Pg(pool) = db else {
            return Err(StoreError::NotPostgres(url.to_owned()));
        };
        Ok(Arc::new(Self {
            pool,
            reload: Notify::new(),
            loading: tokio::sync::Mutex::new(()),
        }))
    }

    /// Writes (or replaces) an instance, live for `ttl`, and tells every
    /// replica, if the instance id is free or `owner_key`'s at the same
    /// endpoint, and every claimed tool name is free or this provider's (or
    /// config hands it over): all in one transaction, so replicas agree.
    /// `Ok(Err(why))`: refused, nothing written.
    pub async fn upsert(
        &self,
        info: &ProviderInstance,
        ttl: Duration,
        owner_key: &str,
        claims: &[Claim],
    ) -> Result<Result<(), String>, sqlx::Error> {
        let tools = Value::Array(info.tools.iter().map(tool_json).collect()).to_string();
        let mut tx = self.pool.begin().await?;
        let owned: Option<String> = sqlx::query_scalar(
            "INSERT INTO omicos_registry_owners (instance_id, owner_key, endpoint) VALUES ($1, $2, $3)
             ON CONFLICT (instance_id) DO UPDATE SET seen_at = now()
              WHERE omicos_registry_owners.owner_key = EXCLUDED.owner_key
                AND omicos_registry_owners.endpoint = EXCLUDED.endpoint
             RETURNING instance_id",
        )
        .bind(&info.instance_id)
        .bind(owner_key)
        .bind(&info.endpoint)
        .fetch_optional(&mut *tx)
        .await?;
        if owned.is_none() {
            return Ok(Err(format!(
                "the instance id `{}` belongs to another registrant (its key or endpoint differs)",
                info.instance_id
            )));
        }
        for c in claims {
            let sql = if c.by_config {
                "INSERT INTO omicos_registry_tools (tool, provider) VALUES ($1, $2)
                 ON CONFLICT (tool) DO UPDATE SET provider = EXCLUDED.provider, claimed_at = now()"
            } else {
                "INSERT INTO omicos_registry_tools (tool, provider) VALUES ($1, $2) ON CONFLICT (tool) DO NOTHING"
            };
            sqlx::query(sql)
                .bind(&c.name)
                .bind(&info.provider)
                .execute(&mut *tx)
                .await?;
            let owner: String =
                sqlx::query_scalar("SELECT provider FROM omicos_registry_tools WHERE tool = $1")
                    .bind(&c.name)
                    .fetch_one(&mut *tx)
                    .await?;
            if owner != info.provider {
                return Ok(Err(format!(
                    "`{}` belongs to the provider `{owner}` that registered it first; `{}` cannot take it over (registry_tool_owners can hand it over)",
                    c.name, info.provider
                )));
            }
        }
        sqlx::query(
            "INSERT INTO omicos_registry_instances
                 (instance_id, provider, endpoint, session_affinity, tools, ttl_ms, last_seen_ms, expires_at)
             VALUES ($1, $2, $3, $4, $5::jsonb, $6::bigint, $7, now() + $6::bigint * interval '1 millisecond')
             ON CONFLICT (instance_id) DO UPDATE SET
                 provider = EXCLUDED.provider, endpoint = EXCLUDED.endpoint,
                 session_affinity = EXCLUDED.session_affinity, tools = EXCLUDED.tools,
                 ttl_ms = EXCLUDED.ttl_ms, last_seen_ms = EXCLUDED.last_seen_ms,
                 expires_at = EXCLUDED.expires_at",
        )
        .bind(&info.instance_id)
        .bind(&info.provider)
        .bind(&info.endpoint)
        .bind(info.session_affinity)
        .bind(tools)
        .bind(ttl.as_millis() as i64)
        .bind(info.last_seen_ms)
        .execute(&mut *tx)
        .await?;
        notify(&mut tx, json!({"k": "set"})).await?;
        tx.commit().await.map(Ok)
    }

    /// Whether `owner_key` owns `instance_id`.
    async fn owner_check(
        tx: &mut sqlx::PgConnection,
        instance_id: &str,
        owner_key: &str,
    ) -> Result<KeyCheck, sqlx::Error> {
        let key: Option<String> = sqlx::query_scalar(
            "SELECT owner_key FROM omicos_registry_owners WHERE instance_id = $1",
        )
        .bind(instance_id)
        .fetch_optional(&mut *tx)
        .await?;
        Ok(match key {
            Some(k) if k == owner_key => KeyCheck::Owner,
            Some(_) => KeyCheck::NotOwner,
            None => KeyCheck::Unknown,
        })
    }

    /// Extends a live instance by its TTL if `owner_key` owns it: the
    /// ownership, and the TTL (`None` when it is unknown or expired).
    pub async fn heartbeat(
        &self,
        instance_id: &str,
        owner_key: &str,
    ) -> Result<(KeyCheck, Option<Duration>), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let check = Self::owner_check(&mut tx, instance_id, owner_key).await?;
        if check != KeyCheck::Owner {
            return Ok((check, None));
        }
        sqlx::query("UPDATE omicos_registry_owners SET seen_at = now() WHERE instance_id = $1")
            .bind(instance_id)
            .execute(&mut *tx)
            .await?;
        let ttl: Option<i64> = sqlx::query_scalar(
            "UPDATE omicos_registry_instances
                SET expires_at = now() + ttl_ms * interval '1 millisecond', last_seen_ms = $2
              WHERE instance_id = $1 AND expires_at > now()
          RETURNING ttl_ms",
        )
        .bind(instance_id)
        .bind(omicos_proto::now_ms())
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(ttl) = ttl {
            notify(&mut tx, json!({"k": "hb", "i": instance_id, "ttl": ttl})).await?;
        }
        tx.commit().await?;
        Ok((check, ttl.map(|ms| Duration::from_millis(ms.max(0) as u64))))
    }

    /// Removes an instance that `owner_key` owns (and its owner) and tells
    /// every replica; false when it is another's. An id nobody holds is
    /// already gone: true.
    pub async fn delete_owned(
        &self,
        instance_id: &str,
        owner_key: &str,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        match Self::owner_check(&mut tx, instance_id, owner_key).await? {
            KeyCheck::NotOwner => return Ok(false),
            KeyCheck::Unknown => {
                let exists: Option<i32> = sqlx::query_scalar(
                    "SELECT 1 FROM omicos_registry_instances WHERE instance_id = $1",
                )
                .bind(instance_id)
                .fetch_optional(&mut *tx)
                .await?;
                return Ok(exists.is_none());
            }
            KeyCheck::Owner => {}
        }
        sqlx::query("DELETE FROM omicos_registry_owners WHERE instance_id = $1")
            .bind(instance_id)
            .execute(&mut *tx)
            .await?;
        let n = sqlx::query("DELETE FROM omicos_registry_instances WHERE instance_id = $1")
            .bind(instance_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n > 0 {
            notify(&mut tx, json!({"k": "set"})).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Removes an instance and tells every replica.
    pub async fn delete(&self, instance_id: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("DELETE FROM omicos_registry_instances WHERE instance_id = $1")
            .bind(instance_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n > 0 {
            notify(&mut tx, json!({"k": "set"})).await?;
        }
        tx.commit().await
    }

    /// Whether the store still lists `instance_id` (another replica drops a
    /// lost instance here before this one hears of it).
    pub async fn instance_listed(&self, instance_id: &str) -> Result<bool, sqlx::Error> {
        let row: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM omicos_registry_instances WHERE instance_id = $1")
                .bind(instance_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.is_some())
    }

    /// A session-affine instance stopped answering during `session`'s call:
    /// removes it and the session's pin in one transaction with one
    /// notification, so every replica re-reads both at once (two separate
    /// notifications would leave a moment in which a replica has dropped one
    /// and not the other, and reports the same loss to the session again).
    pub async fn lost(
        &self,
        instance_id: &str,
        provider: &str,
        session: &str,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM omicos_registry_instances WHERE instance_id = $1")
            .bind(instance_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM omicos_registry_pins WHERE provider = $1 AND session_id = $2")
            .bind(provider)
            .bind(session)
            .execute(&mut *tx)
            .await?;
        notify(&mut tx, json!({"k": "set"})).await?;
        tx.commit().await
    }

    /// Pins `session` to `instance` (`None`: drops the pin) and tells every replica.
    pub async fn pin(
        &self,
        provider: &str,
        session: &str,
        instance: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        match instance {
            Some(i) => {
                sqlx::query(
                    "INSERT INTO omicos_registry_pins (provider, session_id, instance_id) VALUES ($1, $2, $3)
                     ON CONFLICT (provider, session_id) DO UPDATE SET instance_id = EXCLUDED.instance_id, pinned_at = now()",
                )
                .bind(provider)
                .bind(session)
                .bind(i)
                .execute(&mut *tx)
                .await?;
            }
            None => {
                sqlx::query(
                    "DELETE FROM omicos_registry_pins WHERE provider = $1 AND session_id = $2",
                )
                .bind(provider)
                .bind(session)
                .execute(&mut *tx)
                .await?;
            }
        }
        notify(
            &mut tx,
            json!({"k": "pin", "p": provider, "s": session, "i": instance}),
        )
        .await?;
        tx.commit().await
    }

    /// [`SharedStore::pin`] in the background.
    pub fn spawn_pin(self: &Arc<Self>, provider: &str, session: &str, instance: Option<&str>) {
        let me = self.clone();
        let (p, s, i) = (
            provider.to_owned(),
            session.to_owned(),
            instance.map(str::to_owned),
        );
        tokio::spawn(async move {
            if let Err(e) = me.pin(&p, &s, i.as_deref()).await {
                tracing::warn!(provider = %p, session = %s, error = %e, "shared registry: cannot record a session pin");
            }
        });
    }

    /// The live rows: each instance, the time it still lives, and its TTL.
    pub async fn live_set(
        &self,
    ) -> Result<Vec<(ProviderInstance, Duration, Duration)>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT instance_id, provider, endpoint, session_affinity, tools::text AS tools, ttl_ms, last_seen_ms,
                    (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::BIGINT AS remaining_ms
               FROM omicos_registry_instances WHERE expires_at > now()",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let tools: String = r.try_get("tools")?;
            let provider: String = r.try_get("provider")?;
            let tools = serde_json::from_str::<Vec<Value>>(&tools)
                .unwrap_or_default()
                .iter()
                .map(|t| tool_from_json(t, &provider))
                .collect();
            let info = ProviderInstance {
                instance_id: r.try_get("instance_id")?,
                provider,
                endpoint: r.try_get("endpoint")?,
                tools,
                session_affinity: r.try_get("session_affinity")?,
                static_entry: false,
                last_seen_ms: r.try_get("last_seen_ms")?,
            };
            let ms = |k: &str| -> Result<Duration, sqlx::Error> {
                Ok(Duration::from_millis(r.try_get::<i64, _>(k)?.max(0) as u64))
            };
            out.push((info, ms("remaining_ms")?, ms("ttl_ms")?));
        }
        Ok(out)
    }

    /// Every session pin: (provider, session, instance).
    pub async fn pins(&self) -> Result<Vec<(String, String, String)>, sqlx::Error> {
        sqlx::query_as("SELECT provider, session_id, instance_id FROM omicos_registry_pins")
            .fetch_all(&self.pool)
            .await
    }

    /// Deletes expired rows (telling every replica when there were any) and
    /// pins to instances long gone. Every replica sweeps; it is idempotent.
    pub async fn sweep(&self) -> Result<u64, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("DELETE FROM omicos_registry_instances WHERE expires_at <= now()")
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM omicos_registry_pins p WHERE pinned_at < now() - interval '{STALE_PIN_KEEP}'
               AND NOT EXISTS (SELECT 1 FROM omicos_registry_instances i WHERE i.instance_id = p.instance_id)"
        )))
        .execute(&mut *tx)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM omicos_registry_owners o WHERE seen_at < now() - interval '{STALE_PIN_KEEP}'
               AND NOT EXISTS (SELECT 1 FROM omicos_registry_instances i WHERE i.instance_id = o.instance_id)"
        )))
        .execute(&mut *tx)
        .await?;
        if n > 0 {
            notify(&mut tx, json!({"k": "set"})).await?;
        }
        tx.commit().await?;
        Ok(n)
    }

    /// Re-reads the live set and the pins into `registry`.
    pub async fn load_into(&self, registry: &Registry) -> Result<(), sqlx::Error> {
        let _in_order = self.loading.lock().await;
        let live = self.live_set().await?;
        let pins = self.pins().await?;
        registry.apply_live_set(live);
        registry.apply_pins(pins);
        Ok(())
    }

    /// Asks the follower for a full re-read (a heartbeat of an instance this
    /// replica has not seen yet).
    pub fn reload_soon(&self) {
        self.reload.notify_one();
    }

    /// Follows the store into `registry` until `stop`: LISTEN, re-read after
    /// every (re)subscription, apply each notification, re-read and sweep every
    /// `resync`. Reconnects with backoff when the database goes away (the
    /// cached view keeps routing meanwhile; entries expire on their own clock).
    pub fn spawn_follower(
        self: &Arc<Self>,
        registry: Weak<Registry>,
        resync: Duration,
        stop: CancellationToken,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                let run = me.follow(&registry, resync, &stop);
                match run.await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "shared registry: lost the notification channel; reconnecting");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
    }

    async fn follow(
        &self,
        registry: &Weak<Registry>,
        resync: Duration,
        stop: &CancellationToken,
    ) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(CHANNEL).await?;
        // Subscribed first, then read: nothing sent in between is missed.
        let Some(reg) = registry.upgrade() else {
            return Ok(());
        };
        self.load_into(&reg).await?;
        drop(reg);
        let mut tick = tokio::time::interval(resync);
        tick.reset();
        loop {
            tokio::select! {
                n = listener.try_recv() => {
                    let Some(reg) = registry.upgrade() else { return Ok(()) };
                    match n? {
                        Some(n) => {
                            if !self.apply(&reg, n.payload()) {
                                self.load_into(&reg).await?;
                            }
                        }
                        // The connection dropped and came back: re-read what we missed.
                        None => self.load_into(&reg).await?,
                    }
                }
                _ = self.reload.notified() => {
                    let Some(reg) = registry.upgrade() else { return Ok(()) };
                    self.load_into(&reg).await?;
                }
                _ = tick.tick() => {
                    let Some(reg) = registry.upgrade() else { return Ok(()) };
                    self.sweep().await?;
                    self.load_into(&reg).await?;
                }
                _ = stop.cancelled() => return Ok(()),
            }
        }
    }

    /// Applies one notification; false when a full re-read is needed.
    fn apply(&self, reg: &Registry, payload: &str) -> bool {
        let Ok(v) = serde_json::from_str::<Value>(payload) else {
            return false;
        };
        let s = |k: &str| v.get(k).and_then(Value::as_str);
        match s("k") {
            Some("hb") => match (s("i"), v.get("ttl").and_then(Value::as_u64)) {
                (Some(id), Some(ttl)) => reg.apply_heartbeat(id, Duration::from_millis(ttl)),
                _ => false,
            },
            Some("pin") => match (s("p"), s("s")) {
                (Some(p), Some(sess)) => {
                    reg.apply_pin(p, sess, s("i"));
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }
}

async fn notify(tx: &mut sqlx::PgConnection, payload: Value) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload.to_string())
        .execute(tx)
        .await
        .map(|_| ())
}

fn tool_json(t: &ToolSpec) -> Value {
    json!({
        "name": t.name,
        "description": t.description,
        "input_schema_json": t.input_schema_json,
        "risk": t.risk,
        "aliases": t.aliases,
        "deprecated_names": t.deprecated_names,
        "toolset": t.toolset,
        "always_ask": t.always_ask,
        "provider": t.provider,
        "output_schema_json": t.output_schema_json,
    })
}

fn tool_from_json(v: &Value, provider: &str) -> ToolSpec {
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let list = |k: &str| {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let provider_name = s("provider");
    ToolSpec {
        name: s("name"),
        description: s("description"),
        input_schema_json: s("input_schema_json"),
        risk: v.get("risk").and_then(Value::as_i64).unwrap_or(0) as i32,
        aliases: list("aliases"),
        deprecated_names: list("deprecated_names"),
        toolset: s("toolset"),
        always_ask: v
            .get("always_ask")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        provider: if provider_name.is_empty() {
            provider.to_owned()
        } else {
            provider_name
        },
        output_schema_json: s("output_schema_json"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_specs_survive_the_json_column() {
        let t = ToolSpec {
            name: "run_python_code".into(),
            description: "d".into(),
            input_schema_json: r#"{"type":"object"}"#.into(),
            risk: 2,
            aliases: vec!["python".into()],
            deprecated_names: vec!["py".into()],
            toolset: "kernel".into(),
            always_ask: true,
            provider: "kernel".into(),
            output_schema_json: r#"{"type":"object","properties":{"n":{"type":"number"}}}"#.into(),
        };
        assert_eq!(tool_from_json(&tool_json(&t), "kernel"), t);
    }
}
