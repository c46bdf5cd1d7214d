//! localstripe (PyPI, pinned 1.15.10; `.ci/run` installs it and sets `LOCALSTRIPE`), an
//! independent Stripe imitation, run as a process of its own for a test: its PaymentIntents,
//! payment methods for its test cards and IBANs, and its signed webhooks.

use super::{client, eventually, free_port};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const SECRET: &str = "sk_test_claimd_localstripe";

/// The localstripe executable, or why there is none.
pub fn localstripe() -> Result<PathBuf, String> {
    let candidates = [
        std::env::var("LOCALSTRIPE").ok().map(PathBuf::from),
        std::env::var("HOME")
            .ok()
            .map(|h| PathBuf::from(h).join(".cache/claimd/localstripe-1.15.10/bin/localstripe")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "localstripe is not installed (run .ci/run, or: python3 -m venv ~/.cache/claimd/localstripe-1.15.10 && ~/.cache/claimd/localstripe-1.15.10/bin/pip install localstripe==1.15.10)".into()
        })
}

/// Returns the executable, or `None` after saying why the test skips (a failure under CI).
pub fn require_localstripe() -> Option<PathBuf> {
    match localstripe() {
        Ok(p) => Some(p),
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{why}"),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

/// A running localstripe, killed on drop.
pub struct LocalStripe {
    child: std::process::Child,
    pub url: String,
}

impl Drop for LocalStripe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl LocalStripe {
    pub async fn start(bin: &Path) -> LocalStripe {
        let port = free_port();
        let child = std::process::Command::new(bin)
            .args(["--port", &port.to_string(), "--from-scratch"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start localstripe");
        let ls = LocalStripe {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let up = eventually(Duration::from_secs(30), || async {
            client()
                .get(format!("{}/v1/payment_intents", ls.url))
                .bearer_auth(SECRET)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        assert!(up, "localstripe did not start on {}", ls.url);
        ls
    }

    /// Every PaymentIntent, read straight from localstripe (not through the proxy).
    pub async fn payment_intents(&self) -> Vec<Value> {
        list_payment_intents(&self.url).await
    }
}

pub async fn list_payment_intents(base: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/payment_intents?limit=100");
        if let Some(a) = &after {
            url.push_str(&format!("&starting_after={a}"));
        }
        let page: Value = client()
            .get(url)
            .bearer_auth(SECRET)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let data = page["data"].as_array().cloned().unwrap_or_default();
        after = data
            .last()
            .and_then(|p| p["id"].as_str())
            .map(str::to_string);
        all.extend(data);
        if page["has_more"] != json!(true) || after.is_none() {
            return all;
        }
    }
}

impl LocalStripe {
    /// A payment method (`pm_...`) for a test card number or a SEPA IBAN.
    pub async fn payment_method(&self, method: Method) -> String {
        let form: Vec<(&str, &str)> = match method {
            Method::Card(number) => vec![
                ("type", "card"),
                ("card[number]", number),
                ("card[exp_month]", "12"),
                ("card[exp_year]", "2034"),
                ("card[cvc]", "123"),
            ],
            Method::Sepa(iban) => vec![("type", "sepa_debit"), ("sepa_debit[iban]", iban)],
        };
        let pm: Value = client()
            .post(format!("{}/v1/payment_methods", self.url))
            .bearer_auth(SECRET)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(&form).unwrap())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        pm["id"].as_str().expect("a payment method id").to_string()
    }

    /// Registers a webhook endpoint: localstripe signs each event with `secret`
    /// (`Stripe-Signature`) and posts it to `url` about a second after it happens, once.
    pub async fn register_webhook(&self, url: &str, secret: &str) {
        let r = client()
            .post(format!("{}/_config/webhooks/claimd", self.url))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string([("url", url), ("secret", secret)]).unwrap())
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "webhook registered: {}",
            r.status()
        );
    }

    /// A PaymentIntent made straight at localstripe, not through claimd (another system, a
    /// person in the dashboard), confirmed at once with `payment_method` and carrying
    /// `metadata`.
    pub async fn create_payment_intent(
        &self,
        payment_method: &str,
        metadata: &[(&str, &str)],
    ) -> Value {
        let mut form: Vec<(String, String)> = vec![
            ("amount".into(), "1000".into()),
            ("currency".into(), "eur".into()),
            ("payment_method".into(), payment_method.into()),
            ("confirm".into(), "true".into()),
        ];
        for (k, v) in metadata {
            form.push((format!("metadata[{k}]"), v.to_string()));
        }
        let pi: Value = client()
            .post(format!("{}/v1/payment_intents", self.url))
            .bearer_auth(SECRET)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(&form).unwrap())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(pi["id"].is_string(), "a PaymentIntent: {pi}");
        pi
    }

    /// One PaymentIntent by id, straight from localstripe.
    pub async fn payment_intent(&self, id: &str) -> Value {
        client()
            .get(format!("{}/v1/payment_intents/{id}", self.url))
            .bearer_auth(SECRET)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// A test payment method.
#[derive(Debug, Clone, Copy)]
pub enum Method {
    /// A card number (4242424242424242 succeeds; 4000000000000341 is declined when charged;
    /// 4000002500003155 requires 3-D Secure).
    Card(&'static str),
    /// A SEPA debit IBAN (DE89370400440532013000 succeeds at once; DE62370400440532013001 is
    /// `processing`, then fails about 0.5 s later).
    Sepa(&'static str),
}

/// Cards and IBANs by what localstripe does with them.
pub const CARD_OK: Method = Method::Card("4242424242424242");
/// Declined when charged: the call is answered `402`.
pub const CARD_DECLINED: Method = Method::Card("4000000000000341");
/// 3-D Secure: `requires_action`.
pub const CARD_3DS: Method = Method::Card("4000002500003155");
/// SEPA debit that succeeds.
pub const SEPA_OK: Method = Method::Sepa("DE89370400440532013000");
/// SEPA debit that stays `processing`, then fails.
pub const SEPA_FAILS: Method = Method::Sepa("DE62370400440532013001");

/// Waits for `ok` on every PaymentIntent of localstripe matching `filter`.
pub async fn wait_until(ls: &LocalStripe, within: Duration, ok: impl Fn(&[Value]) -> bool) -> bool {
    eventually(within, || async { ok(&ls.payment_intents().await) }).await
}

/// The fault proxy's state: how many `POST /v1/payment_intents` each key made.
#[derive(Default)]
pub struct Faults {
    pub posts: HashMap<String, u32>,
    pub dropped: u32,
    /// Hold each answer of a `POST /v1/payment_intents` this long after localstripe acted
    /// (a worker can be killed meanwhile).
    pub hold: Duration,
}

/// Closes the connection without an answer (hyper drops it when the service fails).
#[derive(Debug)]
struct Dropped;
impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("answer dropped by the fault proxy")
    }
}
impl std::error::Error for Dropped {}

/// Starts the fault proxy in front of `target`; returns its base URL.
pub async fn fault_proxy(target: String, drop_first: u32, faults: Arc<Mutex<Faults>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (target, faults) = (target.clone(), faults.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r| {
                    proxy_one(target.clone(), drop_first, faults.clone(), r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    url
}

async fn proxy_one(
    target: String,
    drop_first: u32,
    faults: Arc<Mutex<Faults>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|_| Dropped)?.to_bytes();
    let path = parts.uri.path().to_string();
    if path == "/v1/payment_intents/search" {
        return Ok(search(&target, parts.uri.query().unwrap_or("")).await);
    }
    let url = format!(
        "{target}{}",
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    );
    let mut forward = client().request(parts.method.clone(), url).body(body);
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST && name != hyper::header::CONTENT_LENGTH {
            forward = forward.header(name, value);
        }
    }
    let answer = forward.send().await.map_err(|_| Dropped)?;
    let status = answer.status();
    let content_type = answer.headers().get(hyper::header::CONTENT_TYPE).cloned();
    let bytes = answer.bytes().await.map_err(|_| Dropped)?;
    if parts.method == hyper::Method::POST && path == "/v1/payment_intents" {
        let key = parts
            .headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let hold = {
            let mut f = faults.lock().unwrap();
            let n = f.posts.entry(key).or_default();
            *n += 1;
            if *n <= drop_first {
                // localstripe has acted: the answer is lost on its way back.
                f.dropped += 1;
                return Err(Dropped);
            }
            f.hold
        };
        tokio::time::sleep(hold).await;
    }
    let mut response = Response::new(Full::new(bytes));
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, ct);
    }
    Ok(response)
}

/// Stripe's `GET /v1/payment_intents/search?query=metadata['K']:'V'`, answered from
/// localstripe's list: `200` with the matches, an empty list when none.
async fn search(target: &str, query: &str) -> Response<Full<Bytes>> {
    let parsed = reqwest::Url::parse(&format!("http://x/?{query}")).unwrap();
    let q = parsed
        .query_pairs()
        .find(|(k, _)| k == "query")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    // metadata['claimd_key']:'value'
    let clause = q
        .strip_prefix("metadata['")
        .and_then(|rest| rest.split_once("']:'"))
        .and_then(|(field, value)| {
            Some((field.to_string(), value.strip_suffix('\'')?.to_string()))
        });
    let Some((field, value)) = clause else {
        let mut r = Response::new(Full::new(Bytes::from(
            json!({"error": {"message": format!("unsupported query {q:?}")}}).to_string(),
        )));
        *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
        return r;
    };
    let data: Vec<Value> = list_payment_intents(target)
        .await
        .into_iter()
        .filter(|p| p["metadata"][&field] == json!(value))
        .collect();
    let body = json!({"object": "search_result", "data": data, "has_more": false});
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}
