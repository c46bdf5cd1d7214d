//! The OpenTelemetry SDK behind [`super::Traces`]: a tracer whose spans a batch processor
//! sends over OTLP/HTTP (protobuf) from a thread of its own.

use super::{Attributes, Step, TracesError, TracesSettings, Value};
use crate::domain::claim::Claim;
use crate::domain::redaction::mask_text;
use crate::domain::trace_context::TraceParent;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, Span,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Spans waiting to be sent, at most: past this, new spans are dropped (counted by the SDK),
/// so a collector that is down never holds up a message.
const QUEUE: usize = 8_192;

/// The tracer, and the attempts open in this process by claim id.
pub(super) struct Exporter {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    attempts: Mutex<HashMap<i64, SpanContext>>,
    shut: std::sync::Once,
}

impl Exporter {
    /// Builds the exporter and its batch processor.
    pub(super) fn start(settings: &TracesSettings) -> Result<Exporter, TracesError> {
        // The exporter's own (blocking) reqwest client speaks TLS through the same provider.
        crate::provider::tls::install_crypto_provider();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(settings.endpoint.clone())
            .with_timeout(Duration::from_secs(10))
            .with_headers(HashMap::new())
            .build()
            .map_err(|e| TracesError(format!("cannot build the OTLP exporter: {e}")))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE)
            .with_scheduled_delay(settings.export_every)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attribute(KeyValue::new(
                "service.instance.id",
                settings.instance.clone(),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("claimd");
        Ok(Exporter {
            provider,
            tracer,
            attempts: Mutex::new(HashMap::new()),
            shut: std::sync::Once::new(),
        })
    }

    /// Sends what is queued and stops; once (the worker's shutdown and the command's end
    /// both ask).
    pub(super) fn shutdown(&self, timeout: Duration) {
        self.shut.call_once(|| {
            if let Err(e) = self.provider.shutdown_with_timeout(timeout) {
                tracing::warn!(error = %e, "traces: not every span was sent at shutdown");
            }
        });
    }

    pub(super) fn intake(
        &self,
        producer: Option<TraceParent>,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> OpenSpan {
        let parent = producer.map(remote).unwrap_or_default();
        let span = self
            .tracer
            .span_builder("claimd.intake")
            .with_kind(SpanKind::Consumer)
            .with_attributes(message_attributes(consumer, tenant, message_id))
            .start_with_context(&self.tracer, &parent);
        OpenSpan { span }
    }

    pub(super) fn step(&self, claim_id: Option<i64>, trace_parent: Option<&str>, step: Step) {
        let parent = self.parent_of(claim_id, trace_parent);
        let mut span = self
            .tracer
            .span_builder(step.name)
            .with_kind(SpanKind::Internal)
            .with_start_time(step.start)
            .with_attributes(key_values(step.attributes))
            .start_with_context(&self.tracer, &parent);
        if let Some(id) = claim_id {
            span.set_attribute(KeyValue::new("claimd.claim.id", id));
        }
        if let Some(why) = step.error {
            span.set_status(Status::error(mask_text(&why)));
        }
        span.end_with_timestamp(step.end.max(step.start));
    }

    pub(super) fn attempt(self: &Arc<Self>, claim: &Claim, attributes: Attributes) -> AttemptGuard {
        let parent = self.parent_of_claim(claim.trace_parent.as_deref());
        let mut span = self
            .tracer
            .span_builder("claimd.attempt")
            .with_kind(SpanKind::Internal)
            .with_attributes(key_values(attributes))
            .start_with_context(&self.tracer, &parent);
        span.set_attribute(KeyValue::new("claimd.claim.id", claim.id));
        span.set_attribute(KeyValue::new("claimd.attempt", i64::from(claim.attempt)));
        let context = span.span_context().clone();
        self.lock().insert(claim.id, context.clone());
        AttemptGuard {
            exporter: self.clone(),
            claim_id: claim.id,
            context,
            span: Some(span),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, SpanContext>> {
        self.attempts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open attempt of the claim in this process, else its intake span.
    fn parent_of(&self, claim_id: Option<i64>, trace_parent: Option<&str>) -> Context {
        if let Some(open) = claim_id.and_then(|id| self.lock().get(&id).cloned()) {
            return Context::new().with_remote_span_context(open);
        }
        self.parent_of_claim(trace_parent)
    }

    fn parent_of_claim(&self, trace_parent: Option<&str>) -> Context {
        trace_parent
            .and_then(|t| TraceParent::parse(t.as_bytes()))
            .map(remote)
            .unwrap_or_default()
    }
}

/// A span open until its `end`.
pub(super) struct OpenSpan {
    span: Span,
}

impl OpenSpan {
    pub(super) fn trace_parent(&self) -> String {
        header_of(self.span.span_context())
    }

    pub(super) fn end(mut self, attributes: Attributes, error: Option<&str>) {
        for kv in key_values(attributes) {
            self.span.set_attribute(kv);
        }
        if let Some(why) = error {
            self.span.set_status(Status::error(mask_text(why)));
        }
        self.span.end();
    }
}

/// An attempt's span, registered as the parent of the claim's steps while it is open.
pub(super) struct AttemptGuard {
    exporter: Arc<Exporter>,
    claim_id: i64,
    context: SpanContext,
    span: Option<Span>,
}

impl AttemptGuard {
    pub(super) fn end(mut self, end: &str, error: Option<&str>) {
        if let Some(mut span) = self.span.take() {
            span.set_attribute(KeyValue::new("claimd.attempt.end", end.to_string()));
            if let Some(why) = error {
                span.set_status(Status::error(mask_text(why)));
            }
            span.end();
        }
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        {
            let mut open = self.exporter.lock();
            if open.get(&self.claim_id) == Some(&self.context) {
                open.remove(&self.claim_id);
            }
        }
        if let Some(mut span) = self.span.take() {
            span.set_attribute(KeyValue::new("claimd.attempt.end", "dropped"));
            span.end();
        }
    }
}

/// A context whose parent is the span `p` names (another process's, or a stored one).
fn remote(p: TraceParent) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(p.trace_id),
        SpanId::from_bytes(p.span_id),
        TraceFlags::new(p.flags),
        true,
        TraceState::default(),
    ))
}

fn header_of(context: &SpanContext) -> String {
    TraceParent {
        trace_id: context.trace_id().to_bytes(),
        span_id: context.span_id().to_bytes(),
        flags: context.trace_flags().to_u8(),
    }
    .to_header()
}

fn message_attributes(consumer: &str, tenant: &str, message_id: &str) -> Vec<KeyValue> {
    let mut kv = vec![
        KeyValue::new("claimd.consumer", consumer.to_string()),
        KeyValue::new("messaging.message.id", message_id.to_string()),
    ];
    if !tenant.is_empty() {
        kv.push(KeyValue::new("claimd.tenant", tenant.to_string()));
    }
    kv
}

fn key_values(attributes: Attributes) -> Vec<KeyValue> {
    attributes
        .into_iter()
        .map(|(k, v)| match v {
            // A step's text may quote a payload or a provider's answer.
            Value::Str(s) => KeyValue::new(k, mask_text(&s)),
            Value::Int(i) => KeyValue::new(k, i),
        })
        .collect()
}
