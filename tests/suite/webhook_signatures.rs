//! Standard Webhooks signatures against an independent implementation: the Python
//! `standardwebhooks` package (PyPI, pinned 1.1.0; `.ci/run` installs it into a venv and sets
//! `STANDARDWEBHOOKS_PYTHON` to that venv's interpreter).
//!
//! (a) Python signs, claimd verifies; (b) claimd signs, Python verifies; (c) both reject the same
//! tampered, forged and out-of-time deliveries. Python's `verify` reads the real clock with a
//! five-minute tolerance, so (b) and (c) sign with the current time.
//!
//! Under CI=true a missing interpreter or package is a failure; elsewhere the test says why it
//! skips.

use axum::http::{HeaderMap, HeaderValue};
use base64::Engine as _;
use claimd::provider::provider_events::signature::{
    Scheme, SignatureError, Verified, Verifier, sign_standard,
};
use serde_json::{Value, json};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const INSTALL: &str = "install it with: python3 -m venv ~/.cache/claimd/standardwebhooks-1.1.0 && ~/.cache/claimd/standardwebhooks-1.1.0/bin/pip install standardwebhooks==1.1.0 && export STANDARDWEBHOOKS_PYTHON=~/.cache/claimd/standardwebhooks-1.1.0/bin/python (or run .ci/run)";

/// Runs a batch of operations: `{"op": "sign", secret, id, ts, body}` answers the
/// `webhook-signature` value; `{"op": "verify", secret, body, headers}` answers "ok" or
/// "rejected: <why>".
const SCRIPT: &str = r#"
import json, sys
from datetime import datetime, timezone
from standardwebhooks import Webhook, WebhookVerificationError
out = []
for c in json.load(sys.stdin):
    wh = Webhook(c["secret"])
    if c["op"] == "sign":
        out.append(wh.sign(c["id"], datetime.fromtimestamp(c["ts"], tz=timezone.utc), c["body"]))
    else:
        try:
            wh.verify(c["body"], c["headers"])
            out.append("ok")
        except WebhookVerificationError as e:
            out.append("rejected: " + str(e))
print(json.dumps(out))
"#;

/// The interpreter that has `standardwebhooks`, or why there is none.
fn python() -> Result<String, String> {
    let python = std::env::var("STANDARDWEBHOOKS_PYTHON")
        .map_err(|_| format!("STANDARDWEBHOOKS_PYTHON is not set; {INSTALL}"))?;
    let out = Command::new(&python)
        .args([
            "-c",
            "import standardwebhooks; print(standardwebhooks.__version__)",
        ])
        .output()
        .map_err(|e| format!("STANDARDWEBHOOKS_PYTHON={python} does not run ({e}); {INSTALL}"))?;
    if !out.status.success() {
        return Err(format!(
            "STANDARDWEBHOOKS_PYTHON={python} cannot import standardwebhooks ({}); {INSTALL}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("no error output")
        ));
    }
    Ok(python)
}

/// Returns the interpreter, or `None` after saying why the test skips (a failure under CI).
fn require_python() -> Option<String> {
    match python() {
        Ok(p) => Some(p),
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{why}"),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

/// Runs [`SCRIPT`] on a batch; one answer per operation.
fn run_python(python: &str, ops: &[Value]) -> Vec<String> {
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(serde_json::to_string(ops).expect("json").as_bytes())
        .expect("write to python");
    let out = child.wait_with_output().expect("python output");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<String> = serde_json::from_slice(&out.stdout).expect("python answers json");
    assert_eq!(answers.len(), ops.len());
    answers
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

fn headers(id: &str, ts: i64, sig: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("webhook-id", HeaderValue::from_str(id).expect("id"));
    h.insert("webhook-timestamp", HeaderValue::from(ts));
    h.insert(
        "webhook-signature",
        HeaderValue::from_str(sig).expect("sig"),
    );
    h
}

fn verifier(secret: &str) -> Verifier {
    Verifier::new(
        Scheme::Standard,
        &[secret.to_string()],
        Duration::from_secs(300),
    )
    .expect("verifier")
}

/// Secrets of several key lengths, with and without the prefix and the padding.
fn secrets() -> Vec<String> {
    let key = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 37 + 11) as u8).collect() };
    let padded = base64::engine::general_purpose::STANDARD;
    let bare = base64::engine::general_purpose::STANDARD_NO_PAD;
    vec![
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string(),
        format!("whsec_{}", padded.encode(key(32))),
        padded.encode(key(32)),
        format!("whsec_{}", bare.encode(key(32))),
        format!("whsec_{}", padded.encode(key(1))),
        format!("whsec_{}", padded.encode(key(64))),
        format!("whsec_{}", padded.encode(key(100))),
    ]
}

const BODIES: [&str; 3] = [
    r#"{"test": 2432232314}"#,
    r#"{"type":"payment.succeeded","data":{"name":"Zoë","amount":1999}}"#,
    "{}",
];

const IDS: [&str; 3] = [
    "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "evt_2024.01.01-x",
    "01J2Z3Y4X5W6V7U8T9S0R1Q2P3",
];

#[test]
fn python_signs_claimd_verifies() {
    let Some(py) = require_python() else {
        return;
    };
    let ts = 1_700_000_000;
    let mut cases = Vec::new();
    for secret in secrets() {
        for (i, body) in BODIES.iter().enumerate() {
            cases.push((secret.clone(), IDS[i], ts + i as i64, *body));
        }
    }
    let ops: Vec<Value> = cases
        .iter()
        .map(|(secret, id, ts, body)| {
            json!({"op": "sign", "secret": secret, "id": id, "ts": ts, "body": body})
        })
        .collect();
    let signatures = run_python(&py, &ops);
    for ((secret, id, ts, body), sig) in cases.iter().zip(&signatures) {
        let got = verifier(secret).verify(&headers(id, *ts, sig), body.as_bytes(), *ts);
        assert_eq!(
            got,
            Ok(Verified {
                timestamp: *ts,
                webhook_id: Some(id.to_string())
            }),
            "{id} {body}"
        );
        // The same bytes as claimd's own signer.
        assert_eq!(
            sign_standard(secret, id, *ts, body.as_bytes()).as_ref(),
            Ok(sig)
        );
    }
    assert_eq!(signatures.len(), secrets().len() * BODIES.len());
}

#[test]
fn claimd_signs_python_verifies() {
    let Some(py) = require_python() else {
        return;
    };
    let ts = now();
    let mut ops = Vec::new();
    for secret in secrets() {
        for (i, body) in BODIES.iter().enumerate() {
            let sig = sign_standard(&secret, IDS[i], ts, body.as_bytes()).expect("sign");
            ops.push(json!({"op": "verify", "secret": secret, "body": body, "headers": {
                "webhook-id": IDS[i], "webhook-timestamp": ts.to_string(), "webhook-signature": sig,
            }}));
            // Several entries, as during a rotation: Python too takes any v1 that matches and
            // skips other versions.
            let junk = base64::engine::general_purpose::STANDARD.encode([9u8; 32]);
            let several = format!("v1a,{junk} v1,{junk} {sig}");
            ops.push(
                json!({"op": "verify", "secret": secret, "body": body, "headers": {
                    "Webhook-Id": IDS[i], "Webhook-Timestamp": ts.to_string(),
                    "Webhook-Signature": several,
                }}),
            );
        }
    }
    let answers = run_python(&py, &ops);
    for (op, answer) in ops.iter().zip(&answers) {
        assert_eq!(answer, "ok", "{op}");
    }
}

#[test]
fn both_reject_what_is_tampered_forged_or_out_of_time() {
    let Some(py) = require_python() else {
        return;
    };
    let secret = secrets()[1].clone();
    let other_secret = secrets()[5].clone();
    let id = "msg_tamper";
    let body = r#"{"amount":1999}"#;
    let tampered = r#"{"amount":9999}"#;
    let ts = now();

    // What each case sends, what claimd must say, and the start of Python's refusal.
    let sig_now = sign_standard(&secret, id, ts, body.as_bytes()).expect("sign");
    let python_sig = run_python(
        &py,
        &[json!({"op": "sign", "secret": secret, "id": id, "ts": ts, "body": body})],
    )
    .remove(0);
    assert_eq!(python_sig, sig_now);
    let forged = sign_standard(&other_secret, id, ts, body.as_bytes()).expect("sign");
    let stale_ts = ts - 600;
    let stale = sign_standard(&secret, id, stale_ts, body.as_bytes()).expect("sign");
    let future_ts = ts + 600;
    let future = sign_standard(&secret, id, future_ts, body.as_bytes()).expect("sign");
    type Case<'a> = (
        &'a str,
        i64,
        &'a str,
        &'a str,
        fn(&SignatureError) -> bool,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        // claimd's signature, tampered body.
        (
            "claimd-signed, tampered body",
            ts,
            sig_now.as_str(),
            tampered,
            |e| *e == SignatureError::Mismatch,
            "rejected: No matching signature",
        ),
        // Python's signature, tampered body.
        (
            "python-signed, tampered body",
            ts,
            python_sig.as_str(),
            tampered,
            |e| *e == SignatureError::Mismatch,
            "rejected: No matching signature",
        ),
        (
            "signed with another secret",
            ts,
            forged.as_str(),
            body,
            |e| *e == SignatureError::Mismatch,
            "rejected: No matching signature",
        ),
        (
            "signed ten minutes ago",
            stale_ts,
            stale.as_str(),
            body,
            |e| matches!(e, SignatureError::Stale { .. }),
            "rejected: Message timestamp too old",
        ),
        (
            "signed ten minutes ahead",
            future_ts,
            future.as_str(),
            body,
            |e| matches!(e, SignatureError::Future { .. }),
            "rejected: Message timestamp too new",
        ),
    ];
    let ops: Vec<Value> = cases
        .iter()
        .map(|(_, t, sig, sent, _, _)| {
            json!({"op": "verify", "secret": secret, "body": sent, "headers": {
                "webhook-id": id, "webhook-timestamp": t.to_string(), "webhook-signature": sig,
            }})
        })
        .collect();
    let answers = run_python(&py, &ops);
    for ((what, t, sig, sent, claimd_says, python_says), answer) in cases.iter().zip(&answers) {
        let got = verifier(&secret).verify(&headers(id, *t, sig), sent.as_bytes(), ts);
        match got {
            Err(ref e) if claimd_says(e) => {}
            other => panic!("{what}: claimd said {other:?}"),
        }
        assert!(
            answer.starts_with(python_says),
            "{what}: python said {answer}"
        );
    }
    // And the untampered delivery passes both, so the refusals above are about the tampering.
    let ok = verifier(&secret).verify(&headers(id, ts, &sig_now), body.as_bytes(), ts);
    assert!(ok.is_ok(), "{ok:?}");
    let answer = run_python(
        &py,
        &[
            json!({"op": "verify", "secret": secret, "body": body, "headers": {
                "webhook-id": id, "webhook-timestamp": ts.to_string(), "webhook-signature": sig_now,
            }}),
        ],
    );
    assert_eq!(answer, ["ok"]);
}
