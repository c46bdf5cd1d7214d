//! The HTTP effect: one request per attempt, the payload verbatim, the idempotency key in the
//! configured header. Secrets (configured headers, URL query strings) never reach logs or errors.

use super::{
    Effect, Lookup, MAX_RESPONSE_BYTES, Outcome, StatusClass, classify_status, parse_retry_after,
};
use crate::claim::Claim;
use crate::config::HttpEffectConfig;
use crate::store::truncate;
use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Client, Method, Url};

/// Why an HTTP effect cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum HttpEffectError {
    /// A configured header name or value is not valid HTTP.
    #[error("header {0:?} is not a valid HTTP header")]
    BadHeader(String),
    /// The method is not valid.
    #[error("method {0:?} is not an HTTP method")]
    BadMethod(String),
    /// The URL cannot be parsed.
    #[error("url is not valid: {0}")]
    BadUrl(String),
    /// The HTTP client could not be built.
    #[error("cannot build HTTP client: {0}")]
    Client(String),
}

/// Checks one configured provider header, as configuration validation does before anything
/// starts: the name must be a valid header name and the value a valid header value (no line
/// breaks or other control characters). The message never contains the value (it is usually a
/// secret).
pub fn check_header(name: &str, value: &str) -> Result<(), String> {
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))?;
    HeaderValue::from_str(value).map_err(|_| {
        "the value is not a valid HTTP header value (a line break or other control character, \
         often a trailing newline from a secret file); the value is not shown"
            .to_string()
    })?;
    Ok(())
}

/// Calls a provider over HTTP.
#[derive(Debug, Clone)]
pub struct HttpEffect {
    client: Client,
    method: Method,
    url: Url,
    idem_header: HeaderName,
    headers: HeaderMap,
    status_url: Option<String>,
}

impl HttpEffect {
    /// Builds the effect from `[consumers.effect]`.
    pub fn new(config: &HttpEffectConfig) -> Result<Self, HttpEffectError> {
        let method = Method::from_bytes(config.method.as_bytes())
            .map_err(|_| HttpEffectError::BadMethod(config.method.clone()))?;
        let url = Url::parse(&config.url).map_err(|e| HttpEffectError::BadUrl(e.to_string()))?;
        let idem_header = HeaderName::from_bytes(config.idempotency_header.as_bytes())
            .map_err(|_| HttpEffectError::BadHeader(config.idempotency_header.clone()))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HttpEffectError::BadHeader(name.clone()))?;
            let mut v = HeaderValue::from_str(value)
                .map_err(|_| HttpEffectError::BadHeader(name.clone()))?;
            // Marked sensitive so no debug output of the client prints it.
            v.set_sensitive(true);
            headers.insert(n, v);
        }
        let client = Client::builder()
            .timeout(config.timeout.0)
            .connect_timeout(config.timeout.0.min(std::time::Duration::from_secs(5)))
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| HttpEffectError::Client(e.to_string()))?;
        Ok(HttpEffect {
            client,
            method,
            url,
            idem_header,
            headers,
            status_url: (!config.status_url.is_empty()).then(|| config.status_url.clone()),
        })
    }
}

/// Percent-encodes a key for use inside a URL path.
pub fn encode_path_segment(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A transport error, described without the URL (which may carry credentials).
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "failed reading the answer"
    } else {
        "connection failed"
    };
    let mut detail = String::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail = s.to_string();
        source = s.source();
    }
    if detail.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {detail}")
    }
}

#[async_trait]
impl Effect for HttpEffect {
    async fn perform(&self, claim: &Claim) -> Outcome {
        let mut request = self
            .client
            .request(self.method.clone(), self.url.clone())
            .headers(self.headers.clone())
            .header(&self.idem_header, claim.idem_key.as_str())
            .body(claim.payload.clone());
        if !claim.content_type.is_empty() {
            request = request.header(CONTENT_TYPE, claim.content_type.as_str());
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                // The TCP connection never opened: the request was not sent.
                return Outcome::NotApplied {
                    status: None,
                    retry_after: None,
                    error: describe(&e),
                };
            }
            Err(e) => {
                return Outcome::Unknown {
                    status: None,
                    error: describe(&e),
                };
            }
        };
        let status = response.status().as_u16();
        let retry_after = parse_retry_after(
            response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
        );
        let body = match response.bytes().await {
            Ok(b) => truncate(&String::from_utf8_lossy(&b), MAX_RESPONSE_BYTES),
            Err(e) => format!("(answer unreadable: {})", describe(&e)),
        };
        let status_i = i32::from(status);
        match classify_status(status) {
            StatusClass::Applied => Outcome::Applied {
                status: status_i,
                response: body,
            },
            StatusClass::Rejected => Outcome::Rejected {
                status: status_i,
                response: body,
            },
            StatusClass::InProgress => Outcome::InProgress { status: status_i },
            StatusClass::NotApplied => Outcome::NotApplied {
                status: Some(status_i),
                retry_after,
                error: format!("provider answered {status}: {}", truncate(&body, 200)),
            },
            StatusClass::Unknown => Outcome::Unknown {
                status: Some(status_i),
                error: format!("provider answered {status}: {}", truncate(&body, 200)),
            },
        }
    }

    async fn lookup(&self, claim: &Claim) -> Option<Lookup> {
        let template = self.status_url.as_ref()?;
        let url = template.replace("{key}", &encode_path_segment(&claim.idem_key));
        let answer = self
            .client
            .get(&url)
            .headers(self.headers.clone())
            .header(&self.idem_header, claim.idem_key.as_str())
            .send()
            .await;
        Some(match answer {
            Err(e) => Lookup::Unknown {
                error: format!("status endpoint {}", describe(&e)),
            },
            Ok(r) if r.status().is_success() => {
                let status = i32::from(r.status().as_u16());
                let body = r.bytes().await.unwrap_or_default();
                Lookup::Found {
                    status,
                    response: truncate(&String::from_utf8_lossy(&body), MAX_RESPONSE_BYTES),
                    provider_id: None,
                }
            }
            Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => Lookup::NotFound {
                status: 404,
                detail: "status endpoint answered 404".into(),
            },
            Ok(r) => Lookup::Unknown {
                error: format!("status endpoint answered {}", r.status().as_u16()),
            },
        })
    }

    fn can_reconcile(&self) -> bool {
        self.status_url.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_for_paths() {
        assert_eq!(encode_path_segment("order-1"), "order-1");
        assert_eq!(encode_path_segment("a/b?c#d"), "a%2Fb%3Fc%23d");
        assert_eq!(encode_path_segment("pay:acme:1"), "pay%3Aacme%3A1");
    }
}
