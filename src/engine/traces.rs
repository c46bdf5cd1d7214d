//! The trace of each message (`[traces]`, docs/traces.md): OpenTelemetry spans sent over
//! OTLP/HTTP, one trace per message, joined to the producer's `traceparent`.
//!
//! The intake span (`claimd.intake`) is the root of what claimd does with a message; its W3C
//! `traceparent` is stored on the claim ([`crate::domain::claim::NewClaim::trace_parent`]), so
//! every later step joins the same trace in whichever instance runs it, after any restart:
//! `claimd.claim` (the commit), `claimd.attempt` (one per attempt, with its calls
//! `claimd.call` and waits `claimd.wait` under it), `claimd.settle` (by the call, a lookup, a
//! provider event or a poll) and `claimd.outcome` (each outcome event a destination
//! confirmed). Spans are made after the fact with their real start and end times, so nothing
//! is held open across a provider call but the attempt's span.
//!
//! Off by default. Sending is best effort and never delays a message: spans go to a bounded
//! queue that a background thread exports; when it is full, spans are dropped, not waited for.

use crate::domain::claim::Claim;
use crate::domain::trace_context::TraceParent;
use std::time::SystemTime;

#[cfg(feature = "otlp")]
mod otlp;

/// An attribute's value.
#[derive(Debug, Clone)]
pub enum Value {
    /// Text.
    Str(String),
    /// A whole number.
    Int(i64),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v.into())
    }
}

/// A span's attributes.
pub type Attributes = Vec<(&'static str, Value)>;

/// One finished step of a claim: its name, times, attributes and, when it went wrong, why.
#[derive(Debug, Clone)]
pub struct Step {
    /// `claimd.call`, `claimd.wait`, `claimd.settle`, ...
    pub name: &'static str,
    /// When it began.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// What it was.
    pub attributes: Attributes,
    /// Set when it failed (the span's status is then an error with this text).
    pub error: Option<String>,
}

impl Step {
    /// A step that took no time, now.
    pub fn now(name: &'static str, attributes: Attributes) -> Step {
        let now = SystemTime::now();
        Step {
            name,
            start: now,
            end: now,
            attributes,
            error: None,
        }
    }

    /// A step that began at `start` and ends now.
    pub fn since(name: &'static str, start: SystemTime, attributes: Attributes) -> Step {
        Step {
            name,
            start,
            end: SystemTime::now(),
            attributes,
            error: None,
        }
    }

    /// The same step, failed with `why`.
    pub fn failed(mut self, why: impl Into<String>) -> Step {
        self.error = Some(why.into());
        self
    }
}

/// Where a claim's steps are traced. Cheap to clone; [`Traces::off`] does nothing.
#[derive(Clone, Default)]
pub struct Traces {
    #[cfg(feature = "otlp")]
    exporter: Option<std::sync::Arc<otlp::Exporter>>,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").field("on", &self.is_on()).finish()
    }
}

/// Why traces could not be started.
#[derive(Debug, thiserror::Error)]
#[error("traces: {0}")]
pub struct TracesError(pub String);

/// The settings of `[traces]` the exporter needs.
#[derive(Debug, Clone)]
pub struct TracesSettings {
    /// The OTLP/HTTP traces URL (`.../v1/traces`).
    pub endpoint: String,
    /// `service.name`.
    pub service_name: String,
    /// `service.instance.id`: this instance's name.
    pub instance: String,
    /// How long spans wait before they are sent (at most; a full batch goes at once).
    pub export_every: std::time::Duration,
}

#[cfg_attr(not(feature = "otlp"), allow(unused_variables))]
impl Traces {
    /// No traces.
    pub fn off() -> Traces {
        Traces::default()
    }

    /// Traces sent to `settings.endpoint`. Must be called inside the Tokio runtime.
    pub fn start(settings: &TracesSettings) -> Result<Traces, TracesError> {
        #[cfg(feature = "otlp")]
        {
            Ok(Traces {
                exporter: Some(std::sync::Arc::new(otlp::Exporter::start(settings)?)),
            })
        }
        #[cfg(not(feature = "otlp"))]
        Err(TracesError(crate::domain::features::missing("otlp")))
    }

    /// Whether spans are made at all.
    pub fn is_on(&self) -> bool {
        #[cfg(feature = "otlp")]
        return self.exporter.is_some();
        #[cfg(not(feature = "otlp"))]
        false
    }

    /// Starts a message's intake span, child of the producer's span when it sent one.
    pub fn intake(
        &self,
        producer: Option<TraceParent>,
        consumer: &str,
        tenant: &str,
        message_id: &str,
    ) -> IntakeSpan {
        #[cfg(feature = "otlp")]
        if let Some(e) = &self.exporter {
            return IntakeSpan {
                inner: Some(Box::new(e.intake(producer, consumer, tenant, message_id))),
            };
        }
        IntakeSpan::default()
    }

    /// Records a finished step of `claim`: under its attempt's span when one is open in this
    /// process, else under its intake span (`claim.trace_parent`), else in a trace of its own.
    pub fn step(&self, claim: &Claim, step: Step) {
        self.step_of(Some(claim.id), claim.trace_parent.as_deref(), step);
    }

    /// [`Traces::step`] for a claim known by its id (when it has one yet) and stored
    /// `traceparent`.
    pub fn step_of(&self, claim_id: Option<i64>, trace_parent: Option<&str>, step: Step) {
        #[cfg(feature = "otlp")]
        if let Some(e) = &self.exporter {
            e.step(claim_id, trace_parent, step);
        }
    }

    /// Opens the span of one attempt of `claim`, under its intake span; the attempt's steps
    /// go under it until it ends ([`AttemptSpan::end`]).
    pub fn attempt(&self, claim: &Claim, attributes: Attributes) -> AttemptSpan {
        #[cfg(feature = "otlp")]
        if let Some(e) = &self.exporter {
            return AttemptSpan {
                inner: Some(Box::new(e.attempt(claim, attributes))),
            };
        }
        AttemptSpan::default()
    }

    /// Sends what is queued and stops the exporter (at shutdown). Blocks up to `timeout`:
    /// call it off the async threads (`spawn_blocking`).
    pub fn shutdown(&self, timeout: std::time::Duration) {
        #[cfg(feature = "otlp")]
        if let Some(e) = &self.exporter {
            e.shutdown(timeout);
        }
    }
}

/// A message's intake span, open from its receipt to the answer.
#[derive(Default)]
pub struct IntakeSpan {
    #[cfg(feature = "otlp")]
    inner: Option<Box<otlp::OpenSpan>>,
}

#[cfg_attr(not(feature = "otlp"), allow(unused_variables))]
impl IntakeSpan {
    /// Its W3C `traceparent`, to store on the claim (`None` when traces are off).
    pub fn trace_parent(&self) -> Option<String> {
        #[cfg(feature = "otlp")]
        return self.inner.as_ref().map(|s| s.trace_parent());
        #[cfg(not(feature = "otlp"))]
        None
    }

    /// Ends it with what intake answered (`accepted`, `duplicate`, or the refusal) and, when
    /// a claim answered, its id.
    pub fn end(self, result: &str, claim_id: Option<i64>, error: Option<&str>) {
        #[cfg(feature = "otlp")]
        if let Some(span) = self.inner {
            let mut attributes: Attributes = vec![("claimd.intake.result", result.into())];
            if let Some(id) = claim_id {
                attributes.push(("claimd.claim.id", id.into()));
            }
            span.end(attributes, error);
        }
    }
}

/// An attempt's open span; ended with [`AttemptSpan::end`], or as `dropped` when the attempt's
/// future is dropped.
#[derive(Default)]
pub struct AttemptSpan {
    #[cfg(feature = "otlp")]
    inner: Option<Box<otlp::AttemptGuard>>,
}

#[cfg_attr(not(feature = "otlp"), allow(unused_variables))]
impl AttemptSpan {
    /// Ends it: `end` says how the attempt ended (`completed`, `left started: ...`, `lost`).
    pub fn end(self, end: &str, error: Option<&str>) {
        #[cfg(feature = "otlp")]
        if let Some(guard) = self.inner {
            guard.end(end, error);
        }
    }
}
