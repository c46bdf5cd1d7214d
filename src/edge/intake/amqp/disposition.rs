//! Carrying a verdict out: the ack, the requeue after a pause, and the dead-letter publish
//! (unchanged plus `claimd-reason`, confirmed by the broker, counted in the store) that must
//! succeed before the original is acknowledged.

use super::*;
use crate::edge::intake::broker::{AfterDeadLetter, after_dead_letter};

/// Handles one delivery to the end: ack, requeue or dead-letter.
#[instrument(skip_all, fields(consumer = %ctx.config.name, message_id = tracing::field::Empty, redelivered = d.redelivered))]
pub(super) async fn handle(ctx: Arc<Ctx>, publisher: Channel, d: AmqpDelivery) {
    match judge(&ctx, &d).await {
        Verdict::Ack => ack(&d).await,
        Verdict::Requeue { delay, why } => {
            debug!(reason = %why, "requeueing");
            requeue(&d, delay, &why).await;
        }
        Verdict::DeadLetter {
            reason,
            sentence,
            message_id,
        } => {
            let published = dead_letter(&ctx.amqp, &publisher, &d, &sentence).await;
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
                AfterDeadLetter::Ack => ack(&d).await,
                AfterDeadLetter::Retry { delay, why } => requeue(&d, delay, &why).await,
            }
        }
    }
}

pub(super) async fn ack(d: &AmqpDelivery) {
    match d.acker.ack(BasicAckOptions::default()).await {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            // The channel is gone: the broker redelivers; a committed claim makes that a
            // duplicate, a dead-lettered message is dead-lettered again.
            warn!("acknowledgement did not reach the broker; it will redeliver the message");
        }
    }
}

pub(super) async fn requeue(d: &AmqpDelivery, delay: Duration, why: &str) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let options = BasicNackOptions {
        multiple: false,
        requeue: true,
    };
    if !matches!(d.acker.nack(options).await, Ok(true)) {
        debug!(reason = %why, "nack did not reach the broker; the message returns to the queue with the channel");
    }
}

/// The dead letter's properties: the original's, less any header nested deeper than
/// [`MAX_HEADER_DEPTH`], plus `claimd-reason`.
pub(super) fn dead_letter_properties(props: &BasicProperties, sentence: &str) -> BasicProperties {
    let mut kept = props
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    for name in verdict::too_deep_names(props) {
        kept.remove(name.as_str());
    }
    let mut headers = FieldTable::from(kept);
    headers.insert(REASON_HEADER.into(), AMQPValue::LongString(sentence.into()));
    props.clone().with_headers(headers)
}

/// Publishes `d` to the dead-letter exchange, unchanged plus the reason header (less any header
/// nested deeper than [`MAX_HEADER_DEPTH`]: the sentence names them), and waits for the
/// broker's confirm. Unroutable (no queue bound) counts as a failure.
pub(super) async fn dead_letter(
    c: &AmqpSourceConfig,
    publisher: &Channel,
    d: &AmqpDelivery,
    sentence: &str,
) -> Result<(), String> {
    let properties = dead_letter_properties(&d.properties, sentence);
    let exchange = short(&c.dead_letter_exchange).map_err(|e| e.to_string())?;
    let confirm = publisher
        .basic_publish(
            exchange,
            d.routing_key.clone(),
            BasicPublishOptions {
                mandatory: true,
                immediate: false,
            },
            &d.data,
            properties,
        )
        .await
        .map_err(|e| format!("publish to {:?}: {e}", c.dead_letter_exchange))?
        .await
        .map_err(|e| format!("confirm from {:?}: {e}", c.dead_letter_exchange))?;
    if !confirm.is_ack() {
        return Err(format!(
            "the broker refused the dead letter (nack) on {:?}",
            c.dead_letter_exchange
        ));
    }
    if let Some(returned) = confirm.take_message() {
        return Err(format!(
            "exchange {:?} has no queue bound ({} {})",
            c.dead_letter_exchange, returned.reply_code, returned.reply_text
        ));
    }
    Ok(())
}
