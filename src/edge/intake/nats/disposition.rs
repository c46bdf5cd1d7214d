//! Carrying a verdict out: the ack, the hold-and-retry of a message nothing was committed for,
//! and the dead-letter publish (acknowledged by a stream, counted in the store) that must
//! succeed before the original is acknowledged. While a message is held, the server is told
//! it is in progress, so it is not redelivered to another worker meanwhile.

use super::Ctx;
use super::headers::{dead_letter_headers, judge};
use crate::edge::intake::broker::{AfterDeadLetter, after_dead_letter};
use crate::edge::intake::refusal::Verdict;
use async_nats::jetstream::{self, AckKind};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, instrument, warn};

/// How long a dead-letter publish may wait for the stream's acknowledgement.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Handles one message to the end: ack, dead-letter, or (stopping) give it back.
#[instrument(skip_all, fields(consumer = %ctx.config.name, message_id = tracing::field::Empty, delivered))]
pub(super) async fn handle(
    ctx: Arc<Ctx>,
    js: jetstream::Context,
    msg: jetstream::Message,
    mut stop: watch::Receiver<bool>,
) {
    let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
    tracing::Span::current().record("delivered", delivered);
    // Tell the server the message is in hand every third of ack_wait, however long the store
    // or a busy consumer keeps it.
    let every = ctx.nats.ack_wait.0 / 3;
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let work = settle(&ctx, &js, &msg, delivered, &mut stop);
    tokio::pin!(work);
    let end = loop {
        tokio::select! {
            end = &mut work => break end,
            _ = progress.tick() => {
                if let Err(e) = msg.ack_with(AckKind::Progress).await {
                    debug!(error = %e, "progress report did not reach the server");
                }
            }
        }
    };
    match end {
        End::Ack => {
            if let Err(e) = msg.double_ack().await {
                // The server redelivers; a committed claim makes that a duplicate, a
                // dead-lettered message is dead-lettered (and counted) again.
                warn!(error = %e, "acknowledgement not confirmed; the server will redeliver the message");
            }
        }
        End::GiveBack(why) => {
            debug!(reason = %why, "giving the message back");
            if let Err(e) = msg.ack_with(AckKind::Nak(None)).await {
                debug!(error = %e, "nak did not reach the server; it redelivers after ack_wait");
            }
        }
    }
}

/// How handling ended.
enum End {
    /// Claimed, a duplicate, or dead-lettered and counted.
    Ack,
    /// Stopping with nothing committed: redeliver it (to another worker) now.
    GiveBack(String),
}

/// Judges, and tries again after a pause while the verdict says to, until claimd stops.
async fn settle(
    ctx: &Ctx,
    js: &jetstream::Context,
    msg: &jetstream::Message,
    delivered: i64,
    stop: &mut watch::Receiver<bool>,
) -> End {
    loop {
        let (delay, why) = match judge(ctx, msg.headers.as_ref(), &msg.payload, delivered).await {
            Verdict::Ack => return End::Ack,
            Verdict::Requeue { delay, why } => (delay, why),
            Verdict::DeadLetter {
                reason,
                sentence,
                message_id,
            } => {
                let published = dead_letter(ctx, js, msg, reason, &sentence).await;
                match after_dead_letter(
                    &ctx.claimer,
                    &ctx.state,
                    published,
                    reason,
                    &sentence,
                    message_id.as_deref(),
                )
                .await
                {
                    AfterDeadLetter::Ack => return End::Ack,
                    AfterDeadLetter::Retry { delay, why } => (delay, why),
                }
            }
        };
        debug!(reason = %why, "holding the message; trying again");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return End::GiveBack(why),
        }
    }
}

/// Publishes `msg` to the dead-letter subject, body unchanged, headers as
/// [`dead_letter_headers`] writes them, and waits for a stream's acknowledgement. No stream
/// taking the subject (no responders) is a failure.
async fn dead_letter(
    ctx: &Ctx,
    js: &jetstream::Context,
    msg: &jetstream::Message,
    reason: crate::edge::intake::refusal::DeadLetterReason,
    sentence: &str,
) -> Result<(), String> {
    let subject = &ctx.nats.dead_letter_subject;
    let headers = dead_letter_headers(
        msg.headers.as_ref(),
        &ctx.nats.message_id_header,
        reason,
        sentence,
        msg.subject.as_str(),
    );
    let publish = async {
        js.publish_with_headers(subject.clone(), headers, msg.payload.clone())
            .await
            .map_err(|e| format!("publish to {subject:?}: {e}"))?
            .await
            .map_err(|e| format!("no stream acknowledged the dead letter on {subject:?}: {e}"))
    };
    match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
        Ok(Ok(_ack)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!(
            "no stream acknowledged the dead letter on {subject:?} within {PUBLISH_TIMEOUT:?}"
        )),
    }
}
