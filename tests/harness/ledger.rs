//! The ledger and how it is sent: the messages (new, duplicate, changed, bad input, two
//! tenants, emails), over HTTP (with clients that hang up) or through RabbitMQ.

use super::*;

/// One case of the bad-input matrix. Each is sent over the scenario's intake and must be
/// refused with a specific answer: an HTTP status, or a dead letter (RabbitMQ).
#[derive(Clone, Copy, Debug)]
pub(super) enum BadCase {
    /// No message id at all.
    NoKey,
    /// A 300-character message id.
    LongKey,
    /// A control character (HTTP: a space, which no client library lets through raw) in the id.
    ControlChar,
    /// A message id (HTTP) or tenant header (RabbitMQ) that is not UTF-8.
    InvalidUtf8,
    /// A consumer nobody configured (HTTP only: a queue has one consumer).
    UnknownConsumer,
    /// A body over `max_body_bytes` (4096 here).
    Oversized,
    /// An email whose JSON is cut short.
    TruncatedEmail,
}

impl BadCase {
    pub(super) fn all(intake: Intake) -> Vec<BadCase> {
        let mut v = vec![
            BadCase::NoKey,
            BadCase::LongKey,
            BadCase::ControlChar,
            BadCase::InvalidUtf8,
            BadCase::Oversized,
            BadCase::TruncatedEmail,
        ];
        if intake == Intake::Http {
            v.push(BadCase::UnknownConsumer);
        }
        v
    }

    pub(super) fn consumer(self) -> &'static str {
        match self {
            BadCase::TruncatedEmail => "email",
            BadCase::UnknownConsumer => "nosuch",
            _ => "payments",
        }
    }

    pub(super) fn body(self) -> Vec<u8> {
        match self {
            BadCase::Oversized => vec![b'x'; 8192],
            BadCase::TruncatedEmail => br#"{"to":"a@example.com","subj"#.to_vec(),
            _ => b"{}".to_vec(),
        }
    }

    /// The message id bytes (HTTP `Idempotency-Key`, AMQP `message_id`).
    pub(super) fn key(self, seq: usize) -> Option<Vec<u8>> {
        match self {
            BadCase::NoKey => None,
            BadCase::LongKey => Some("k".repeat(300).into_bytes()),
            BadCase::ControlChar => Some(format!("ctl\u{1}{seq}").into_bytes()),
            BadCase::InvalidUtf8 => Some(format!("bad{seq}\u{ff}").into_bytes()),
            _ => Some(format!("bad-{seq}").into_bytes()),
        }
    }

    pub(super) fn http_status(self) -> u16 {
        match self {
            BadCase::UnknownConsumer => 404,
            BadCase::Oversized => 413,
            BadCase::TruncatedEmail => 422,
            _ => 400,
        }
    }
}

#[derive(Clone)]
pub(super) enum Send_ {
    /// A message (or a duplicate of one): must end acknowledged. `tenant` is `""` for none.
    Message {
        consumer: &'static str,
        tenant: &'static str,
        id: String,
        body: String,
    },
    /// The same key sent twice at the same instant (to two workers; or two publishes).
    Concurrent {
        consumer: &'static str,
        tenant: &'static str,
        id: String,
        body: String,
    },
    /// A used key with another body: must get 422 (HTTP) or be dead-lettered (RabbitMQ).
    Changed { seq: usize, id: String },
    /// Bad input: must be refused.
    Bad { seq: usize, case: BadCase },
}

/// Something the chaos loop did, and when.
pub(super) type Moment = (chrono::DateTime<chrono::Utc>, String);

/// The share of the ledger delivered so far (0 to 1): the other senders and the chaos loop
/// keep pace with it, so that they spread over the send phase however long it runs.
pub(super) type LedgerShare = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Waits until at least `share` of the ledger is delivered.
pub(super) async fn keep_pace(ledger_share: &LedgerShare, share: f64) {
    while ledger_share() < share {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A message's identity: (tenant, message id).
type Identity = (String, String);

pub(super) struct Ledger {
    /// Acknowledged identities.
    pub(super) acked: Mutex<HashSet<Identity>>,
    pub(super) dup_acks: AtomicUsize,
    pub(super) mismatch_refusals: AtomicUsize,
    pub(super) bad_refused: AtomicUsize,
    pub(super) attempts: AtomicU64,
    /// Sends whose client hung up.
    pub(super) hung_up: AtomicUsize,
    /// Share of HTTP sends that hang up ([`Scenario::hang_ups`]).
    pub(super) hang_ups: f64,
    pub(super) seed: u64,
}

/// A seeded generator for one send (so a run replays with its seed, whatever the order the
/// clients take the ledger in).
pub(super) fn send_rng(seed: u64, key: &[u8], start: usize) -> fastrand::Rng {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    rng(seed ^ h ^ (start as u64).rotate_left(32))
}

/// Sends until a definite answer: connection errors and 503s are retried on another worker
/// (an at-least-once client). With `may_hang_up`, a share of the attempts (the scenario's
/// `hang_ups`) hang up mid-request instead: no answer, so the client sends again. Returns the
/// final status.
#[allow(clippy::too_many_arguments)]
pub(super) async fn send(
    c: &reqwest::Client,
    ports: &[u16],
    start: usize,
    consumer: &str,
    key: Option<&[u8]>,
    tenant: &str,
    body: Vec<u8>,
    ledger: &Ledger,
    may_hang_up: bool,
) -> u16 {
    let mut r = send_rng(ledger.seed, key.unwrap_or_default(), start);
    for i in start..start + 2000 {
        let port = ports[i % ports.len()];
        ledger.attempts.fetch_add(1, Ordering::Relaxed);
        if may_hang_up
            && ledger.hang_ups > 0.0
            && r.f64() < ledger.hang_ups
            && let Some(k) = key.and_then(|k| std::str::from_utf8(k).ok())
        {
            let mut post = Post::new(consumer, k, body.clone());
            if !tenant.is_empty() {
                post = post.tenant("Tenant-Id", tenant);
            }
            let how = HangUp::random(&mut r);
            if hangup::post_and_hang_up(([127, 0, 0, 1], port).into(), &post, how).await
                != Seen::NotSent
            {
                ledger.hung_up.fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(r.u64(10..100))).await;
            continue;
        }
        let mut req = c
            .post(format!("http://127.0.0.1:{port}/v1/messages/{consumer}"))
            .body(body.clone());
        if !tenant.is_empty() {
            req = req.header("Tenant-Id", tenant);
        }
        if let Some(k) = key {
            // Raw bytes: obs-text (0x80-0xff) goes out as is; control characters, which no
            // client library sends, go out by hand.
            match HeaderValue::from_bytes(k) {
                Ok(v) => req = req.header("Idempotency-Key", v),
                Err(_) => match try_raw_post(
                    ([127, 0, 0, 1], port).into(),
                    &format!("/v1/messages/{consumer}"),
                    k,
                    &body,
                )
                .await
                .map(|(status, _)| status)
                {
                    Some(0 | 503) | None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Some(status) => return status,
                },
            }
        }
        match req.send().await {
            Ok(r) if r.status().as_u16() == 503 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(r) => {
                let status = r.status().as_u16();
                if status == 200 {
                    ledger.dup_acks.fetch_add(1, Ordering::Relaxed);
                }
                return status;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("no definite answer for {key:?}");
}

pub(super) fn rng(seed: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed)
}

/// Where the client sends.
#[derive(Clone)]
pub(super) enum Via {
    Http(Vec<u16>),
    Amqp(Arc<Queues>),
}

pub(super) fn amqp_props(
    id: Option<&[u8]>,
    seq: Option<usize>,
    tenant: Option<&[u8]>,
) -> BasicProperties {
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let mut h = FieldTable::default();
    if let Some(id) = id {
        // In a header, not the `message_id` property: a property is at most 255 bytes, and the
        // matrix needs a longer id.
        h.insert(
            "x-message-id".into(),
            AMQPValue::LongString(LongString::from(id)),
        );
    }
    if let Some(seq) = seq {
        h.insert("chaos-bad".into(), AMQPValue::LongLongInt(seq as i64));
    }
    if let Some(t) = tenant {
        h.insert("tenant".into(), AMQPValue::LongString(LongString::from(t)));
    }
    props.with_headers(h)
}

/// Sends one ledger item and records what the intake answered.
pub(super) async fn deliver(
    item: Send_,
    via: &Via,
    c: &reqwest::Client,
    publisher: &Publisher,
    n: usize,
    ledger: &Ledger,
    expected_dead: &Mutex<HashSet<usize>>,
) {
    let tenant_bytes = |t: &'static str| (!t.is_empty()).then_some(t.as_bytes());
    match (item, via) {
        (
            Send_::Message {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Http(ports),
        ) => {
            let st = send(
                c,
                ports,
                n,
                consumer,
                Some(id.as_bytes()),
                tenant,
                body.into_bytes(),
                ledger,
                true,
            )
            .await;
            assert!(st == 202 || st == 200, "message {tenant}/{id}: {st}");
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (
            Send_::Message {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Amqp(q),
        ) => {
            let props = amqp_props(Some(id.as_bytes()), None, tenant_bytes(tenant));
            publisher
                .publish(&q.queue(consumer), props, body.as_bytes(), ledger)
                .await;
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (
            Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Http(ports),
        ) => {
            let key = Some(id.as_bytes());
            let (a, b) = tokio::join!(
                send(
                    c,
                    ports,
                    n,
                    consumer,
                    key,
                    tenant,
                    body.clone().into_bytes(),
                    ledger,
                    true,
                ),
                send(
                    c,
                    ports,
                    n + 1,
                    consumer,
                    key,
                    tenant,
                    body.into_bytes(),
                    ledger,
                    true,
                )
            );
            assert!(
                [200, 202].contains(&a) && [200, 202].contains(&b),
                "{tenant}/{id}: {a} {b}"
            );
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (
            Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            },
            Via::Amqp(q),
        ) => {
            // Two publishes at once: with three workers consuming, the copies are usually
            // delivered to two of them at the same instant.
            let props = amqp_props(Some(id.as_bytes()), None, tenant_bytes(tenant));
            let queue = q.queue(consumer);
            tokio::join!(
                publisher.publish(&queue, props.clone(), body.as_bytes(), ledger),
                publisher.publish(&queue, props, body.as_bytes(), ledger)
            );
            ledger.acked.lock().unwrap().insert((tenant.into(), id));
        }
        (Send_::Changed { id, .. }, Via::Http(ports)) => {
            let body = b"{\"amount\":-1}".to_vec();
            let key = Some(id.as_bytes());
            let st = send(c, ports, n, "payments", key, "", body, ledger, true).await;
            assert_eq!(st, 422, "changed payload under {id}");
            ledger.mismatch_refusals.fetch_add(1, Ordering::Relaxed);
        }
        (Send_::Changed { seq, id }, Via::Amqp(q)) => {
            expected_dead.lock().unwrap().insert(seq);
            let props = amqp_props(Some(id.as_bytes()), Some(seq), None);
            publisher
                .publish(&q.queue("payments"), props, b"{\"amount\":-1}", ledger)
                .await;
        }
        (Send_::Bad { seq, case }, Via::Http(ports)) => {
            let key = case.key(seq);
            let st = send(
                c,
                ports,
                n,
                case.consumer(),
                key.as_deref(),
                "",
                case.body(),
                ledger,
                false,
            )
            .await;
            assert_eq!(st, case.http_status(), "bad input {case:?}");
            ledger.bad_refused.fetch_add(1, Ordering::Relaxed);
        }
        (Send_::Bad { seq, case }, Via::Amqp(q)) => {
            expected_dead.lock().unwrap().insert(seq);
            let props = match case {
                // The id is fine; the tenant header is not UTF-8.
                BadCase::InvalidUtf8 => amqp_props(
                    Some(format!("badt-{seq}").as_bytes()),
                    Some(seq),
                    Some(&[b't', 0xff, 0xfe]),
                ),
                _ => amqp_props(case.key(seq).as_deref(), Some(seq), None),
            };
            publisher
                .publish(&q.queue(case.consumer()), props, &case.body(), ledger)
                .await;
        }
    }
}

/// The ledger of a run, from its scenario and seed.
pub(super) struct Plan {
    /// Payments, emails, database-effect messages, duplicates and bad input, shuffled.
    pub(super) first: Vec<Send_>,
    /// Changed payloads, sent once the first wave is claimed.
    pub(super) later: Vec<Send_>,
    pub(super) duplicates_sent: usize,
    pub(super) emails: Vec<String>,
    pub(super) two_tenant_ids: Vec<String>,
    pub(super) mismatches_sent: usize,
    pub(super) bad_sent: usize,
}

/// Builds the ledger of sends of `s`.
pub(super) fn plan(s: &Scenario) -> Plan {
    // The ledger of sends.
    let mut r = rng(s.seed);
    let mut sends = Vec::new();
    let mut duplicates_sent = 0;
    let mut emails = Vec::new();
    let mut two_tenant_ids = Vec::new();
    // Changed payloads go to the first ids (no tenant): two-tenant ids come after them.
    let changed = if s.bad_input {
        (s.messages / 50).max(3)
    } else {
        0
    };
    for m in 0..s.messages + s.emails {
        let (consumer, id, body) = if m < s.messages {
            let body = format!("{{\"amount\":{}}}", r.u32(1..100_000));
            ("payments", format!("m{}-{m}", s.seed), body)
        } else {
            let id = format!("e{}-{m}", s.seed);
            emails.push(id.clone());
            let body = format!(
                "{{\"to\":\"user{m}@example.com\",\"subject\":\"receipt {m}\",\"text\":\"thanks\"}}"
            );
            ("email", id, body)
        };
        // Some payment ids are sent by two tenants with the same body: two messages, two keys.
        let tenants: &[&'static str] = if consumer == "payments"
            && m >= changed
            && s.two_tenants > 0.0
            && r.f64() < s.two_tenants
        {
            two_tenant_ids.push(id.clone());
            &["acme", "globex"]
        } else {
            &[""]
        };
        for tenant in tenants {
            sends.push(Send_::Message {
                consumer,
                tenant,
                id: id.clone(),
                body: body.clone(),
            });
        }
        let tenant = tenants[0];
        if r.f64() < 0.15 {
            duplicates_sent += 1;
            sends.push(Send_::Message {
                consumer,
                tenant,
                id: id.clone(),
                body: body.clone(),
            });
        }
        if r.f64() < 0.03 {
            duplicates_sent += 1; // the second of the pair is a duplicate
            sends.push(Send_::Concurrent {
                consumer,
                tenant,
                id,
                body,
            });
        }
    }
    let mut mismatches_sent = 0;
    let mut bad_sent = 0;
    let mut seq = 0;
    if s.bad_input {
        for k in 0..changed {
            mismatches_sent += 1;
            seq += 1;
            sends.push(Send_::Changed {
                seq,
                id: format!("m{}-{k}", s.seed),
            });
        }
        for _ in 0..(s.messages / 100).max(2) {
            for case in BadCase::all(s.intake) {
                bad_sent += 1;
                seq += 1;
                sends.push(Send_::Bad { seq, case });
            }
        }
    }
    sends.extend(dbeffect::messages(s.seed, s.db_effect));
    // Changed payloads go after their originals were claimed: a second wave.
    let (mut first, later): (Vec<_>, Vec<_>) = sends
        .into_iter()
        .partition(|x| !matches!(x, Send_::Changed { .. }));
    // Payments, emails, duplicates and bad input interleaved, as traffic arrives (seeded).
    r.shuffle(&mut first);
    Plan {
        first,
        later,
        duplicates_sent,
        emails,
        two_tenant_ids,
        mismatches_sent,
        bad_sent,
    }
}
