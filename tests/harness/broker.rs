//! The run's RabbitMQ queues and a confirming publisher.

use super::*;

/// The RabbitMQ side of a run: a work queue per consumer (claimd declares them, with a fanout
/// dead-letter exchange `<queue>.dlx` and `<queue>.dead`), deleted at the end.
pub(super) struct Queues {
    pub(super) prefix: String,
    /// The consumers that read a queue of the run.
    pub(super) consumers: Vec<&'static str>,
}

impl Queues {
    /// Queues for the payments and the emails, and for the database effect with `ledger`.
    pub(super) fn new(ledger: bool) -> Queues {
        let mut consumers = vec!["payments", "email"];
        if ledger {
            consumers.push("ledger");
        }
        Queues {
            prefix: format!("chaos.{}-{:08x}", std::process::id(), fastrand::u32(..)),
            consumers,
        }
    }

    pub(super) fn queue(&self, consumer: &str) -> String {
        format!("{}.{consumer}", self.prefix)
    }

    /// The `[[consumers]]` keys that make `consumer` read its queue.
    pub(super) fn consumer_toml(&self, consumer: &str) -> String {
        let q = self.queue(consumer);
        format!(
            "source = \"amqp\"\namqp_url = \"{}\"\nqueue = \"{q}\"\ndead_letter_exchange = \"{q}.dlx\"\nprefetch = 64\ndeclare = true\nmessage_id_header = \"x-message-id\"\n",
            amqp_url()
        )
    }

    /// Ready messages in `consumer`'s queue (and its dead-letter queue).
    pub(super) async fn ready(&self, conn: &Connection, consumer: &str) -> Option<(u32, u32)> {
        let ch = conn.create_channel().await.ok()?;
        let mut out = [0u32; 2];
        for (i, q) in [
            self.queue(consumer),
            format!("{}.dead", self.queue(consumer)),
        ]
        .iter()
        .enumerate()
        {
            let d = ch
                .queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .ok()?;
            out[i] = d.message_count();
        }
        let _ = ch.close(200, "ok".into()).await;
        Some((out[0], out[1]))
    }

    /// Takes every dead letter of `consumer` and returns the `chaos-bad` sequence numbers.
    pub(super) async fn dead_seqs(&self, conn: &Connection, consumer: &str) -> Vec<usize> {
        let ch = conn.create_channel().await.unwrap();
        let dead = format!("{}.dead", self.queue(consumer));
        let mut seqs = Vec::new();
        while let Some(m) = ch
            .basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let seq = m
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("chaos-bad").cloned());
            match seq {
                Some(AMQPValue::LongLongInt(n)) => seqs.push(n as usize),
                other => panic!("a dead letter the harness did not send as bad: {other:?}"),
            }
        }
        let _ = ch.close(200, "ok".into()).await;
        seqs
    }

    pub(super) async fn delete(&self) {
        let Ok(conn) = Connection::connect(&amqp_url(), ConnectionProperties::default()).await
        else {
            return;
        };
        if let Ok(ch) = conn.create_channel().await {
            for c in &self.consumers {
                let q = self.queue(c);
                for name in [q.clone(), format!("{q}.dead")] {
                    let _ = ch
                        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = ch
                    .exchange_delete(
                        format!("{q}.dlx").as_str().into(),
                        ExchangeDeleteOptions::default(),
                    )
                    .await;
            }
        }
        let _ = conn.close(200, "ok".into()).await;
    }
}

impl Drop for Queues {
    /// Deletes the run's queues even when the run panicked (from a plain thread: the run's
    /// runtime may be shutting down). Deleting twice is harmless.
    fn drop(&mut self) {
        let q = Queues {
            prefix: std::mem::take(&mut self.prefix),
            consumers: std::mem::take(&mut self.consumers),
        };
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(q.delete());
            std::mem::forget(q);
        })
        .join();
    }
}

/// An at-least-once publisher: persistent messages, publisher confirms, and a publish that
/// was not confirmed (broker down, connection cut, queue not declared yet) is published again.
pub(super) struct Publisher {
    pub(super) link: tokio::sync::Mutex<Option<(Connection, Channel)>>,
}

impl Publisher {
    pub(super) fn new() -> Publisher {
        Publisher {
            link: tokio::sync::Mutex::new(None),
        }
    }

    pub(super) async fn channel(&self) -> Option<Channel> {
        let mut link = self.link.lock().await;
        if let Some((conn, ch)) = link.as_ref()
            && conn.status().connected()
            && ch.status().connected()
        {
            return Some(ch.clone());
        }
        *link = None;
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(&amqp_url(), ConnectionProperties::default()),
        )
        .await
        .ok()?
        .ok()?;
        let ch = conn.create_channel().await.ok()?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .ok()?;
        *link = Some((conn, ch.clone()));
        Some(ch)
    }

    /// Publishes to `queue` until the broker confirms it was queued.
    pub(super) async fn publish(
        &self,
        queue: &str,
        props: BasicProperties,
        body: &[u8],
        ledger: &Ledger,
    ) {
        for _ in 0..3000 {
            ledger.attempts.fetch_add(1, Ordering::Relaxed);
            if let Some(ch) = self.channel().await {
                let sent = tokio::time::timeout(Duration::from_secs(10), async {
                    ch.basic_publish(
                        ShortString::from(""),
                        ShortString::from(queue),
                        BasicPublishOptions {
                            mandatory: true,
                            immediate: false,
                        },
                        body,
                        props.clone(),
                    )
                    .await?
                    .await
                })
                .await;
                match sent {
                    // Returned (no such queue yet) or nacked: publish again.
                    Ok(Ok(c)) => {
                        if c.is_ack() && c.take_message().is_none() {
                            return;
                        }
                    }
                    _ => *self.link.lock().await = None,
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the broker never confirmed a publish to {queue}");
    }
}
