//! The SMTP effect: one email per claim, with `Message-ID: <{key}@{message_id_domain}>` so the
//! idempotency key travels with the mail and receivers that de-duplicate on Message-ID can.
//!
//! The SMTP dialogue is driven step by step on lettre's connection type (not its pooled
//! transport) so every failure is known to have happened before or after the message content
//! was sent: a server can only accept a message on the final `.`, so anything that fails
//! before that point provably sent nothing (`NotApplied` or `Rejected`), and a connection
//! that breaks or times out once the content is on its way is `Unknown` (invariant I6).
//!
//! | where | answer | outcome |
//! |---|---|---|
//! | connect, greeting, EHLO, STARTTLS, AUTH | anything but success | `NotApplied` (the session failed, not this message) |
//! | MAIL, RCPT, DATA | `4xx` | `NotApplied` |
//! | MAIL, RCPT, DATA | `5xx` | `Rejected` |
//! | MAIL, RCPT, DATA | connection broke, timed out | `NotApplied` |
//! | after the content (final `.`) | `2xx` | `Applied` |
//! | after the content | `4xx` | `NotApplied` (the server refused before accepting) |
//! | after the content | `5xx` | `Rejected` |
//! | after the content | connection broke, timed out, unreadable answer | `Unknown` |

use super::{Effect, Lookup, MAX_RESPONSE_BYTES, Outcome};
use crate::domain::claim::Claim;
use crate::provider::effect::settings::{SmtpEffectConfig, SmtpTls};
use crate::store::truncate;
use async_trait::async_trait;
use lettre::Message;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::{Credentials, DEFAULT_MECHANISMS};
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::{ClientId, Extension, MailBodyParameter, MailParameter};
use lettre::transport::smtp::response::{Response, Severity};
use serde::Deserialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 8;
/// An idle connection older than this is closed rather than reused (servers drop idle clients).
const MAX_IDLE_AGE: Duration = Duration::from_secs(30);

/// Why an SMTP effect cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum SmtpEffectError {
    /// The TLS parameters could not be built.
    #[error("cannot set up TLS for {host}: {message}")]
    Tls {
        /// The SMTP host.
        host: String,
        /// What went wrong.
        message: String,
    },
    /// The configured `from` is not a mailbox.
    #[error("from {0:?} is not an email address: {1}")]
    BadFrom(String, String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsMode {
    None,
    StartTls,
    Implicit,
}

/// Sends email over SMTP.
pub struct SmtpEffect {
    host: String,
    port: u16,
    tls: TlsMode,
    tls_params: Option<TlsParameters>,
    credentials: Option<Credentials>,
    hello: ClientId,
    domain: String,
    from: Option<Mailbox>,
    subject: String,
    timeout: Duration,
    idle: Mutex<Vec<(AsyncSmtpConnection, Instant)>>,
}

impl std::fmt::Debug for SmtpEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No credentials here.
        f.debug_struct("SmtpEffect")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The payload of an email claim (`Content-Type: application/json`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmailPayload {
    #[serde(default)]
    to: Option<Recipients>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    html: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Recipients {
    One(String),
    Many(Vec<String>),
}

/// An email ready to be built, checked against the configuration.
#[derive(Debug)]
struct Email {
    to: Vec<Mailbox>,
    from: Mailbox,
    subject: String,
    text: Option<String>,
    html: Option<String>,
}

/// How far one send got. Only `CONTENT` can have delivered anything.
const SETUP: u8 = 0;
const ENVELOPE: u8 = 1;
const CONTENT: u8 = 2;

/// A failed send, with the step it failed in.
#[derive(Debug)]
enum SendError {
    /// The server answered, or the connection failed, in `stage`.
    Smtp {
        stage: u8,
        error: lettre::transport::smtp::Error,
    },
    /// The message needs an SMTP extension the server does not offer; nothing was sent.
    Unsupported(String),
}

/// Whether `content_type` can carry JSON (`""`, `application/json`, `…+json`).
fn is_json_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence.is_empty() || essence == "application/json" || essence.ends_with("+json")
}

/// The left part of the Message-ID for `key`: characters allowed in an RFC 5322 `dot-atom`
/// are kept, anything else (and `=`) becomes `=XX`. Keys made of letters, digits and
/// `-_.` appear verbatim; the mapping is one-to-one, so distinct keys never share an id.
pub fn message_id_left(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = String::with_capacity(key.len());
    for (i, &b) in bytes.iter().enumerate() {
        let atext = b.is_ascii_alphanumeric() || b"!#$%&'*+-/?^_`{|}~".contains(&b);
        let dot_ok = b == b'.' && i > 0 && i + 1 < bytes.len() && bytes[i - 1] != b'.';
        if atext || dot_ok {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

impl SmtpEffect {
    /// Builds the effect from `[consumers.effect]` with `kind = "smtp"`.
    pub fn new(config: &SmtpEffectConfig) -> Result<Self, SmtpEffectError> {
        let tls = match config.tls {
            SmtpTls::None => TlsMode::None,
            SmtpTls::Starttls => TlsMode::StartTls,
            SmtpTls::Tls => TlsMode::Implicit,
        };
        let tls_params = if tls == TlsMode::None {
            None
        } else {
            Some(
                TlsParameters::new(config.host.clone()).map_err(|e| SmtpEffectError::Tls {
                    host: config.host.clone(),
                    message: e.to_string(),
                })?,
            )
        };
        let from = if config.from.is_empty() {
            None
        } else {
            Some(
                config
                    .from
                    .parse::<Mailbox>()
                    .map_err(|e| SmtpEffectError::BadFrom(config.from.clone(), e.to_string()))?,
            )
        };
        let credentials = (!config.username.is_empty())
            .then(|| Credentials::new(config.username.clone(), config.password.clone()));
        Ok(SmtpEffect {
            host: config.host.clone(),
            port: config.port,
            tls,
            tls_params,
            credentials,
            hello: ClientId::default(),
            domain: config.message_id_domain.clone(),
            from,
            subject: config.subject.clone(),
            timeout: config.timeout.0,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Reads and checks a payload: JSON, at least one recipient, a sender (from the payload
    /// or the configuration), every address valid.
    fn parse(&self, payload: &[u8], content_type: &str) -> Result<Email, String> {
        if !is_json_type(content_type) {
            return Err(format!(
                "the email payload must be JSON (content type application/json), not {content_type:?}"
            ));
        }
        let p: EmailPayload = serde_json::from_slice(payload).map_err(|e| {
            format!(
                "the email payload is not the expected JSON object {{\"to\", \"from\", \"subject\", \"text\", \"html\"}}: {e}"
            )
        })?;
        let to: Vec<String> = match p.to {
            None => Vec::new(),
            Some(Recipients::One(s)) => vec![s],
            Some(Recipients::Many(v)) => v,
        };
        let to: Vec<String> = to.into_iter().filter(|s| !s.trim().is_empty()).collect();
        if to.is_empty() {
            return Err("the email has no recipient (\"to\" is missing or empty)".into());
        }
        let to = to
            .iter()
            .map(|s| {
                s.parse::<Mailbox>()
                    .map_err(|e| format!("recipient {s:?} is not an email address: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let from = match p.from.filter(|f| !f.trim().is_empty()) {
            Some(f) => f
                .parse::<Mailbox>()
                .map_err(|e| format!("sender {f:?} is not an email address: {e}"))?,
            None => self.from.clone().ok_or_else(|| {
                "the email has no sender: the payload has no \"from\" and the consumer has no effect.from".to_string()
            })?,
        };
        Ok(Email {
            to,
            from,
            subject: p.subject.unwrap_or_else(|| self.subject.clone()),
            text: p.text,
            html: p.html,
        })
    }

    /// The message for `key`, with its Message-ID.
    fn build(&self, email: Email, key: &str) -> Result<Message, String> {
        let mut b = Message::builder()
            .from(email.from)
            .subject(email.subject)
            .message_id(Some(format!("<{}@{}>", message_id_left(key), self.domain)));
        for to in email.to {
            b = b.to(to);
        }
        let built = match (email.text, email.html) {
            (Some(text), Some(html)) => b.multipart(MultiPart::alternative_plain_html(text, html)),
            (None, Some(html)) => b.singlepart(SinglePart::html(html)),
            (text, None) => b.singlepart(SinglePart::plain(text.unwrap_or_default())),
        };
        built.map_err(|e| format!("the email cannot be built: {e}"))
    }

    async fn connect(&self) -> Result<AsyncSmtpConnection, lettre::transport::smtp::Error> {
        let implicit = match self.tls {
            TlsMode::Implicit => self.tls_params.clone(),
            _ => None,
        };
        let mut conn = AsyncSmtpConnection::connect_tokio1(
            (self.host.as_str(), self.port),
            Some(self.timeout),
            &self.hello,
            implicit,
            None,
        )
        .await?;
        if self.tls == TlsMode::StartTls
            && let Some(params) = self.tls_params.clone()
        {
            // Refuses (an error, never a plaintext fallback) when the server lacks STARTTLS.
            conn.starttls(params, &self.hello).await?;
        }
        if let Some(credentials) = &self.credentials {
            conn.auth(DEFAULT_MECHANISMS, credentials).await?;
        }
        Ok(conn)
    }

    fn take_idle(&self) -> Option<AsyncSmtpConnection> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((conn, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE_AGE && !conn.has_broken() {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: AsyncSmtpConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((conn, Instant::now()));
        }
    }

    /// One mail transaction on an open connection; `stage` records how far it got.
    async fn transact(
        conn: &mut AsyncSmtpConnection,
        message: &Message,
        body: &[u8],
        stage: &AtomicU8,
    ) -> Result<Response, SendError> {
        let at = |stage: u8| move |error| SendError::Smtp { stage, error };
        stage.store(ENVELOPE, Ordering::SeqCst);
        let envelope = message.envelope();
        let mut params = Vec::new();
        let ascii = envelope
            .from()
            .into_iter()
            .chain(envelope.to())
            .all(|a| AsRef::<str>::as_ref(a).is_ascii());
        if !ascii {
            if !conn.server_info().supports_feature(Extension::SmtpUtfEight) {
                return Err(SendError::Unsupported(
                    "an address is not ASCII and the server does not offer SMTPUTF8".into(),
                ));
            }
            params.push(MailParameter::SmtpUtfEight);
        }
        if !body.is_ascii() {
            if !conn.server_info().supports_feature(Extension::EightBitMime) {
                return Err(SendError::Unsupported(
                    "the message is not 7-bit and the server does not offer 8BITMIME".into(),
                ));
            }
            params.push(MailParameter::Body(MailBodyParameter::EightBitMime));
        }
        conn.command(Mail::new(envelope.from().cloned(), params))
            .await
            .map_err(at(ENVELOPE))?;
        for to in envelope.to() {
            conn.command(Rcpt::new(to.clone(), vec![]))
                .await
                .map_err(at(ENVELOPE))?;
        }
        conn.command(Data).await.map_err(at(ENVELOPE))?;
        // From here on the server may accept the message at any moment.
        stage.store(CONTENT, Ordering::SeqCst);
        conn.message(body).await.map_err(at(CONTENT))
    }

    /// Sends on a pooled connection, or a new one. A pooled connection that fails before the
    /// content (the server closed it while idle) is replaced once: nothing was sent on it.
    async fn send(&self, message: &Message, stage: &AtomicU8) -> Result<Response, SendError> {
        let body = message.formatted();
        if let Some(mut conn) = self.take_idle() {
            match Self::transact(&mut conn, message, &body, stage).await {
                Ok(r) => {
                    self.put_idle(conn);
                    return Ok(r);
                }
                Err(SendError::Smtp { stage: s, error })
                    if s < CONTENT && error.status().is_none() =>
                {
                    debug!(error = %error, "pooled SMTP connection failed before the content; reconnecting");
                }
                Err(e) => return Err(e),
            }
        }
        stage.store(SETUP, Ordering::SeqCst);
        let mut conn = self.connect().await.map_err(|error| SendError::Smtp {
            stage: SETUP,
            error,
        })?;
        let r = Self::transact(&mut conn, message, &body, stage).await?;
        self.put_idle(conn);
        Ok(r)
    }
}

/// The reply's text, for the claim (`250 2.0.0 Ok: queued as …`).
fn reply_text(r: &Response) -> String {
    let code: u16 = r.code().into();
    let lines: Vec<&str> = r.message().collect();
    truncate(&format!("{code} {}", lines.join(" ")), MAX_RESPONSE_BYTES)
}

/// Classifies a failed send (see the module table).
fn classify(e: SendError) -> Outcome {
    match e {
        SendError::Unsupported(why) => Outcome::NotApplied {
            status: None,
            retry_after: None,
            error: format!("not sent: {why}"),
        },
        SendError::Smtp { stage, error } => {
            let code = error.status();
            let status = code.map(|c| i32::from(u16::from(c)));
            let detail = truncate(&error.to_string(), 300);
            match (stage, code.map(|c| c.severity)) {
                (SETUP, _) => Outcome::NotApplied {
                    status,
                    retry_after: None,
                    error: format!("SMTP session could not be set up: {detail}"),
                },
                (_, Some(Severity::PermanentNegativeCompletion)) => Outcome::Rejected {
                    status: status.unwrap_or(500),
                    response: detail,
                },
                (_, Some(_)) => Outcome::NotApplied {
                    status,
                    retry_after: None,
                    error: format!("SMTP server refused for now: {detail}"),
                },
                (CONTENT, None) => Outcome::Unknown {
                    status: None,
                    error: format!(
                        "connection failed after the message content was sent; it may have been delivered: {detail}"
                    ),
                },
                (_, None) => Outcome::NotApplied {
                    status: None,
                    retry_after: None,
                    error: format!(
                        "connection failed before the message content was sent: {detail}"
                    ),
                },
            }
        }
    }
}

#[async_trait]
impl Effect for SmtpEffect {
    async fn perform(&self, claim: &Claim) -> Outcome {
        // Validated at intake; a configuration change (no default sender any more) can still
        // make a stored payload unusable: permanent, and no SMTP status to show.
        let message = match self
            .parse(&claim.payload, &claim.content_type)
            .and_then(|email| self.build(email, &claim.idem_key))
        {
            Ok(m) => m,
            Err(why) => {
                return Outcome::Rejected {
                    status: 0,
                    response: format!("not sent: {why}"),
                };
            }
        };
        let stage = AtomicU8::new(SETUP);
        match tokio::time::timeout(self.timeout, self.send(&message, &stage)).await {
            Ok(Ok(reply)) => {
                let code: u16 = reply.code().into();
                Outcome::Applied {
                    status: i32::from(code),
                    response: reply_text(&reply),
                }
            }
            Ok(Err(e)) => classify(e),
            Err(_) if stage.load(Ordering::SeqCst) == CONTENT => Outcome::Unknown {
                status: None,
                error: format!(
                    "timed out after {:?} waiting for the answer to the message content; it may have been delivered",
                    self.timeout
                ),
            },
            Err(_) => Outcome::NotApplied {
                status: None,
                retry_after: None,
                error: format!(
                    "timed out after {:?} before the message content was sent",
                    self.timeout
                ),
            },
        }
    }

    async fn lookup(&self, _claim: &Claim) -> Option<Lookup> {
        // SMTP has no status endpoint.
        None
    }

    fn can_reconcile(&self) -> bool {
        false
    }

    fn validate(&self, payload: &[u8], content_type: &str) -> Result<(), String> {
        let email = self.parse(payload, content_type)?;
        self.build(email, "validate").map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::duration::Dur;

    fn effect(from: &str) -> SmtpEffect {
        SmtpEffect::new(&SmtpEffectConfig {
            host: "127.0.0.1".into(),
            port: 2525,
            tls: SmtpTls::None,
            username: String::new(),
            password: String::new(),
            message_id_domain: "mail.example".into(),
            from: from.into(),
            subject: "Default subject".into(),
            timeout: Dur(Duration::from_secs(5)),
            max_key_length: 255,
        })
        .unwrap()
    }

    #[test]
    fn payloads_without_recipient_sender_or_json_are_refused() {
        let e = effect("");
        let ok = br#"{"to":"a@example.com","from":"b@example.com","text":"hi"}"#;
        assert!(e.validate(ok, "application/json").is_ok());
        assert!(e.validate(ok, "").is_ok());
        assert!(
            e.validate(ok, "application/vnd.mail+json; charset=utf-8")
                .is_ok()
        );
        for (payload, ct, needle) in [
            (
                &br#"{"from":"b@example.com"}"#[..],
                "application/json",
                "no recipient",
            ),
            (br#"{"to":[],"from":"b@example.com"}"#, "", "no recipient"),
            (br#"{"to":"a@example.com"}"#, "", "no sender"),
            (
                br#"{"to":"not an address","from":"b@example.com"}"#,
                "",
                "recipient",
            ),
            (b"hello", "", "not the expected JSON"),
            (ok, "text/plain", "must be JSON"),
            (
                br#"{"to":"a@example.com","from":"b@example.com","subjct":"x"}"#,
                "",
                "subjct",
            ),
        ] {
            let err = e.validate(payload, ct).unwrap_err();
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
        }
        let with_default = effect("Claimd <noreply@example.com>");
        assert!(
            with_default
                .validate(br#"{"to":["a@example.com","c@example.com"]}"#, "")
                .is_ok()
        );
    }

    #[test]
    fn message_ids_carry_the_key_one_to_one() {
        assert_eq!(message_id_left("mail-001"), "mail-001");
        assert_eq!(message_id_left("a.b"), "a.b");
        assert_eq!(message_id_left("pay:acme:1"), "pay=3Aacme=3A1");
        assert_eq!(message_id_left("a=3Ab"), "a=3D3Ab");
        assert_eq!(message_id_left(".a..b."), "=2Ea.=2Eb=2E");
        assert_ne!(message_id_left("a:b"), message_id_left("a=3Ab"));
    }

    #[test]
    fn the_built_message_has_the_key_in_its_message_id() {
        let e = effect("noreply@example.com");
        let email = e
            .parse(br#"{"to":"a@example.com","text":"hello"}"#, "")
            .unwrap();
        let m = e.build(email, "mail-7").unwrap();
        let text = String::from_utf8(m.formatted()).unwrap();
        assert!(text.contains("Message-ID: <mail-7@mail.example>"), "{text}");
        assert!(text.contains("Subject: Default subject"), "{text}");
    }
}
