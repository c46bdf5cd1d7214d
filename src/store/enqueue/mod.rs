//! Transactional enqueue: a message becomes a claim inside the producer's own database
//! transaction ([`enqueue`]), so the claim exists if and only if the producer commits. The
//! claim is written without a lease owner and with the "not called yet" marker; a worker takes
//! it after the commit (`engine::enqueued`) and performs it like one from HTTP intake.
//!
//! The refusals are HTTP intake's, from the same checks of [`crate::domain`], read against the
//! registry every worker writes at start ([`Registration`]): a producer's transaction knows the
//! consumers only through it. On PostgreSQL the claim is written by the SQL function the
//! migrations install (`claimd.enqueue_bytes`, the one producers in other languages call), so
//! both ways in share one implementation; on SQLite by the statements of `enqueue/sql.rs`.

mod sql;

use crate::domain::claim::{
    IdError, KeyTemplate, KeyTooLong, TenantNotKeyed, validate_content_type, validate_message_id,
    validate_tenant,
};
use crate::domain::json_body::{self, NotJson};
use async_trait::async_trait;

/// What a worker writes of each configured consumer for producers' transactions to check
/// against (`claimd_consumers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The consumer's name.
    pub name: String,
    /// Its idempotency-key template (`key`).
    pub key_template: String,
    /// The provider's longest key (`effect.max_key_length`).
    pub max_key_length: usize,
    /// Whether the key mentions `{tenant}` (a tenant is refused otherwise).
    pub keys_tenant: bool,
    /// The largest payload HTTP intake takes (`[http] max_body_bytes`).
    pub max_payload_bytes: usize,
    /// Whether it orders its claims by an `order_key` (an enqueued claim, which has none, is
    /// refused then).
    pub ordered: bool,
    /// The path segments of its provider's URLs that a message fills, as a JSON array
    /// (`Effect::url_segments`): an enqueued message that makes one `.`, `..` or empty is
    /// refused (`CD011`), as HTTP intake refuses it: on PostgreSQL by the SQL function, on
    /// SQLite by [`enqueue`] itself.
    pub url_segments: String,
    /// The consumer's configuration generation (`generation`): a registration never
    /// overwrites a higher one, nor the same one with another effect kind
    /// ([`crate::domain::generation`]).
    pub generation: i64,
    /// Its effect's kind (`http`, `smtp`, `sql`, `custom`).
    pub effect_kind: String,
}

/// One message to enqueue. [`Enqueue::new`] takes no tenant and `application/json`.
#[derive(Debug, Clone, Copy)]
pub struct Enqueue<'a> {
    /// The consumer's name.
    pub consumer: &'a str,
    /// The message id (1-255 visible ASCII characters).
    pub message_id: &'a str,
    /// The payload, verbatim.
    pub payload: &'a [u8],
    /// The tenant (`""`: none).
    pub tenant: &'a str,
    /// The payload's content type.
    pub content_type: &'a str,
    /// The claim's priority, from -100 to 100 (docs/flow-control.md, "Priorities"): a
    /// consumer's pickup takes higher ones first.
    pub priority: i16,
}

impl<'a> Enqueue<'a> {
    /// A JSON message for `consumer` without a tenant.
    pub fn new(consumer: &'a str, message_id: &'a str, payload: &'a [u8]) -> Self {
        Enqueue {
            consumer,
            message_id,
            payload,
            tenant: "",
            content_type: "application/json",
            priority: crate::domain::priority::DEFAULT,
        }
    }

    /// With a priority from -100 to 100 (default 0); another is refused by [`enqueue`]
    /// ([`EnqueueError::BadPriority`]).
    pub fn priority(self, priority: i16) -> Self {
        Enqueue { priority, ..self }
    }

    /// With a tenant (the consumer's key must mention `{tenant}`).
    pub fn tenant(self, tenant: &'a str) -> Self {
        Enqueue { tenant, ..self }
    }

    /// With another content type.
    pub fn content_type(self, content_type: &'a str) -> Self {
        Enqueue {
            content_type,
            ..self
        }
    }
}

/// What became of an enqueued message, once the transaction commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new claim, with its id.
    New(i64),
    /// The message was already claimed with the same payload: that claim's id (its
    /// `duplicate_count` is one more).
    Duplicate(i64),
}

impl Enqueued {
    /// The claim's id, new or existing.
    pub fn id(self) -> i64 {
        match self {
            Enqueued::New(id) | Enqueued::Duplicate(id) => id,
        }
    }
}

/// Why a message was not enqueued. The transaction is left as it was (on PostgreSQL a refusal
/// raised by the SQL function aborts it: roll it back).
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// No worker has registered a consumer of that name (its configuration names none, or no
    /// worker of this version started yet).
    #[error(
        "unknown consumer {0:?}: no worker has registered it (start a worker configured with it first)"
    )]
    UnknownConsumer(String),
    /// The message id or tenant is unusable.
    #[error("{0}")]
    BadId(#[from] IdError),
    /// A tenant for a consumer whose key does not mention `{tenant}`.
    #[error(transparent)]
    TenantNotKeyed(#[from] TenantNotKeyed),
    /// The priority is not from -100 to 100.
    #[error(transparent)]
    BadPriority(#[from] crate::domain::priority::PriorityError),
    /// The content type cannot be stored and sent to the provider.
    #[error("{0}")]
    BadContentType(String),
    /// The payload is larger than HTTP intake takes.
    #[error("the body is {len} bytes, over the limit of {max} bytes ([http] max_body_bytes)")]
    TooLarge {
        /// The payload's size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The content type declares JSON and the payload does not parse.
    #[error("{0}")]
    NotJson(#[from] NotJson),
    /// The rendered idempotency key is longer than the provider accepts.
    #[error(transparent)]
    KeyTooLong(#[from] KeyTooLong),
    /// The message id was already used with another payload (I5).
    #[error(
        "consumer {consumer:?}, tenant {tenant:?}, message id {message_id:?}: already used with a different payload (idempotency key {key:?})"
    )]
    Conflict {
        /// The consumer.
        consumer: String,
        /// The tenant (`""`: none).
        tenant: String,
        /// The message id.
        message_id: String,
        /// The claim's idempotency key.
        key: String,
    },
    /// The registry holds a key template this build cannot read (a newer worker wrote it).
    #[error("consumer {consumer:?}: registered key template {template:?}: {why}")]
    Registry {
        /// The consumer.
        consumer: String,
        /// The template.
        template: String,
        /// Why it was not read.
        why: String,
    },
    /// The consumer orders its claims by an `order_key`, which an enqueued claim cannot carry.
    #[error(
        "consumer {0:?} orders its claims by order_key, which an enqueued claim cannot carry: send the message through HTTP or AMQP intake"
    )]
    Ordered(String),
    /// The SQL function refused the message (its SQLSTATE, `CD0xx`, and message).
    #[error("claimd.enqueue refused the message ({code}): {message}")]
    Refused {
        /// The SQLSTATE.
        code: String,
        /// The database's message.
        message: String,
    },
    /// The database failed.
    #[error("enqueue: {0}")]
    Database(#[from] sqlx::Error),
}

/// A consumer's registry entry as a producer's transaction reads it.
struct Registered {
    template: String,
    max_key_length: i64,
    max_payload_bytes: i64,
    ordered: bool,
}

/// What [`check`] passes on to the insert.
struct Checked {
    key: String,
}

/// HTTP intake's refusals, in its order, against the registry entry.
fn check(e: &Enqueue<'_>, reg: &Registered) -> Result<Checked, EnqueueError> {
    if reg.ordered {
        return Err(EnqueueError::Ordered(e.consumer.to_string()));
    }
    let max_payload = usize::try_from(reg.max_payload_bytes).unwrap_or(usize::MAX);
    if e.payload.len() > max_payload {
        return Err(EnqueueError::TooLarge {
            len: e.payload.len(),
            max: max_payload,
        });
    }
    let message_id = validate_message_id(e.message_id.as_bytes())?;
    let tenant = validate_tenant(e.tenant.as_bytes())?;
    crate::domain::priority::check(i64::from(e.priority))?;
    let template: KeyTemplate =
        reg.template
            .parse()
            .map_err(
                |why: crate::domain::claim::KeyTemplateError| EnqueueError::Registry {
                    consumer: e.consumer.to_string(),
                    template: reg.template.clone(),
                    why: why.to_string(),
                },
            )?;
    if !tenant.is_empty() && !template.mentions_tenant() {
        return Err(TenantNotKeyed {
            consumer: e.consumer.to_string(),
            template: reg.template.clone(),
        }
        .into());
    }
    let content_type =
        validate_content_type(e.content_type.as_bytes()).map_err(EnqueueError::BadContentType)?;
    json_body::check(content_type.as_bytes(), e.payload)?;
    let key = template.render(e.consumer, tenant, message_id);
    let max = usize::try_from(reg.max_key_length).unwrap_or(0);
    if key.len() > max {
        return Err(KeyTooLong {
            len: key.len(),
            max,
            template: reg.template.clone(),
        }
        .into());
    }
    Ok(Checked { key })
}

/// A connection (or transaction) a message can be enqueued on: PostgreSQL's and SQLite's.
#[async_trait]
pub trait EnqueueConn: Send {
    /// Enqueues `message` on this connection; see [`enqueue`].
    async fn enqueue_message(&mut self, message: &Enqueue<'_>) -> Result<Enqueued, EnqueueError>;
}

/// Enqueues a message in the caller's transaction: the claim exists if and only if the
/// transaction commits, and a worker performs it once after the commit (at once on PostgreSQL,
/// woken by a notification; within its poll on SQLite). A duplicate (same consumer, tenant,
/// message id and payload) answers the existing claim; the same id with another payload is
/// [`EnqueueError::Conflict`], naming the key.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// // ... the producer's own writes ...
/// let claim = claimd::enqueue(&mut tx, &claimd::Enqueue::new("payments", "order-1", br#"{"amount":500}"#)).await?;
/// tx.commit().await?;
/// # let _ = claim; Ok(()) }
/// ```
pub async fn enqueue<C: EnqueueConn + ?Sized>(
    conn: &mut C,
    message: &Enqueue<'_>,
) -> Result<Enqueued, EnqueueError> {
    conn.enqueue_message(message).await
}

#[cfg(feature = "postgres")]
#[async_trait]
impl EnqueueConn for sqlx::PgConnection {
    async fn enqueue_message(&mut self, e: &Enqueue<'_>) -> Result<Enqueued, EnqueueError> {
        use sqlx::Row;
        // Unnamed statements: the producer's connection may go through a pooler in
        // transaction mode, where a named one meets other clients' (docs/producers.md).
        let row = sqlx::query(sql::PG_REGISTRY)
            .bind(e.consumer)
            .persistent(false)
            .fetch_optional(&mut *self)
            .await?
            .ok_or_else(|| EnqueueError::UnknownConsumer(e.consumer.to_string()))?;
        let reg = Registered {
            template: row.try_get("key_template")?,
            max_key_length: i64::from(row.try_get::<i32, _>("max_key_length")?),
            max_payload_bytes: row.try_get("max_payload_bytes")?,
            ordered: row.try_get("ordered")?,
        };
        let checked = check(e, &reg)?;
        let answer = sqlx::query(sql::PG_ENQUEUE)
            .bind(e.consumer)
            .bind(e.message_id)
            .bind(e.payload)
            .bind(e.tenant)
            .bind(e.content_type)
            .bind(i32::from(e.priority))
            .persistent(false)
            .fetch_one(&mut *self)
            .await;
        let row = match answer {
            Ok(row) => row,
            Err(err) => return Err(refusal(err, e, checked.key)),
        };
        let id: i64 = row.try_get("id")?;
        Ok(if row.try_get::<bool, _>("created")? {
            Enqueued::New(id)
        } else {
            Enqueued::Duplicate(id)
        })
    }
}

/// The SQL function's refusal as an [`EnqueueError`]: `CD009` is the conflict; `CD011` (a
/// value that makes a path segment of the provider's URL `.`, `..` or empty) is checked only
/// there; the other `CD0xx` codes are the checks already made here, met only if the registry
/// changed between.
#[cfg(feature = "postgres")]
fn refusal(err: sqlx::Error, e: &Enqueue<'_>, key: String) -> EnqueueError {
    let Some(db) = err.as_database_error() else {
        return err.into();
    };
    match db.code().as_deref() {
        Some("CD009") => EnqueueError::Conflict {
            consumer: e.consumer.to_string(),
            tenant: e.tenant.to_string(),
            message_id: e.message_id.to_string(),
            key,
        },
        Some("CD010") => EnqueueError::Ordered(e.consumer.to_string()),
        Some("CD012") => EnqueueError::BadPriority(crate::domain::priority::PriorityError(
            e.priority.to_string(),
        )),
        Some(code) if code.starts_with("CD") => EnqueueError::Refused {
            code: code.to_string(),
            message: db.message().to_string(),
        },
        _ => err.into(),
    }
}

#[cfg(feature = "postgres")]
#[async_trait]
impl EnqueueConn for sqlx::Transaction<'_, sqlx::Postgres> {
    async fn enqueue_message(&mut self, e: &Enqueue<'_>) -> Result<Enqueued, EnqueueError> {
        (**self).enqueue_message(e).await
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl EnqueueConn for sqlx::SqliteConnection {
    async fn enqueue_message(&mut self, e: &Enqueue<'_>) -> Result<Enqueued, EnqueueError> {
        use sqlx::Row;
        let row = sqlx::query(sql::SQLITE_REGISTRY)
            .bind(e.consumer)
            .fetch_optional(&mut *self)
            .await?
            .ok_or_else(|| EnqueueError::UnknownConsumer(e.consumer.to_string()))?;
        let reg = Registered {
            template: row.try_get("key_template")?,
            max_key_length: row.try_get("max_key_length")?,
            max_payload_bytes: row.try_get("max_payload_bytes")?,
            ordered: row.try_get("ordered")?,
        };
        let checked = check(e, &reg)?;
        if let Some(message) =
            url_fault(&row.try_get::<String, _>("url_segments")?, e, &checked.key)
        {
            return Err(EnqueueError::Refused {
                code: "CD011".into(),
                message,
            });
        }
        let print = crate::domain::claim::fingerprint(e.payload);
        let inserted = sqlx::query(sql::SQLITE_INSERT)
            .bind(e.consumer)
            .bind(e.tenant)
            .bind(e.message_id)
            .bind(&checked.key)
            .bind(&print)
            .bind(e.payload)
            .bind(e.content_type)
            .bind(e.priority)
            .fetch_optional(&mut *self)
            .await?;
        if let Some(row) = inserted {
            return Ok(Enqueued::New(row.try_get("id")?));
        }
        let row = sqlx::query(sql::SQLITE_EXISTING)
            .bind(e.consumer)
            .bind(e.tenant)
            .bind(e.message_id)
            .fetch_one(&mut *self)
            .await?;
        let id: i64 = row.try_get("id")?;
        if row.try_get::<String, _>("fingerprint")? != print {
            return Err(EnqueueError::Conflict {
                consumer: e.consumer.to_string(),
                tenant: e.tenant.to_string(),
                message_id: e.message_id.to_string(),
                key: row.try_get("idem_key")?,
            });
        }
        sqlx::query(sql::SQLITE_COUNT_DUPLICATE)
            .bind(id)
            .execute(&mut *self)
            .await?;
        Ok(Enqueued::Duplicate(id))
    }
}

/// The refusal of a message whose values make a path segment of the provider's URL unsafe,
/// read against the registry's segments (`url_segments`) as the PostgreSQL function reads them.
#[cfg(feature = "sqlite")]
fn url_fault(segments: &str, e: &Enqueue<'_>, key: &str) -> Option<String> {
    use crate::domain::url_segment::{SegmentIds, registry_fault};
    let segments: serde_json::Value = serde_json::from_str(segments).ok()?;
    let payload: Option<serde_json::Value> = serde_json::from_slice(e.payload).ok();
    let ids = SegmentIds {
        key,
        message_id: e.message_id,
        tenant: e.tenant,
        consumer: e.consumer,
    };
    registry_fault(&segments, &ids, payload.as_ref())
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl EnqueueConn for sqlx::Transaction<'_, sqlx::Sqlite> {
    async fn enqueue_message(&mut self, e: &Enqueue<'_>) -> Result<Enqueued, EnqueueError> {
        (**self).enqueue_message(e).await
    }
}
