//! Acting from the operator page (issue 15), as a browser does it (form posts with the session
//! cookie): sign in, resolve one parked claim and redrive a set by reason, each shown before
//! it is taken, each recorded in the history as `page:<name>`; without the page's CSRF token,
//! or without a session, nothing changes.

use crate::common;

use claimd::domain::claim::ClaimState;
use common::*;

fn no_redirects() -> reqwest::Client {
    claimd::provider::tls::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `application/x-www-form-urlencoded` of `fields`.
fn form(fields: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(fields).unwrap()
}

fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a csrf field on the page")
        + 19;
    page[at..at + page[at..].find('"').unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_in_person_resolves_and_redrives_from_the_page() {
    let (_store, _sandbox, running) = payments_worker("admin_token = \"s3cret-admin-token\"").await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    parked_claim(
        &s,
        "payments",
        "paid-1",
        "outcome unknown (timeout); on_unknown = \"park\"",
    )
    .await;
    parked_claim(
        &s,
        "payments",
        "lost-1",
        "previous attempt ended without an answer",
    )
    .await;
    parked_claim(
        &s,
        "payments",
        "lost-2",
        "previous attempt ended without an answer",
    )
    .await;
    let c = no_redirects();
    let post = |path: &str, cookie: Option<&str>, body: String| {
        let mut r = c
            .post(format!("{base}{path}"))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(k) = cookie {
            r = r.header("Cookie", k);
        }
        r.send()
    };

    // Opened with the bearer header (a script, a proxy): read-only, no forms.
    let page = c
        .get(format!("{base}/"))
        .bearer_auth("s3cret-admin-token")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !page.contains("/actions/preview"),
        "no forms without a session"
    );
    // Each card names the key to look up at the provider; parked claims are grouped by reason.
    assert!(
        page.contains("look it up at the provider): <code>paid-1</code>"),
        "{page}"
    );
    assert!(
        page.contains("By reason: <strong>2</strong> × previous attempt ended without an answer"),
        "{page}"
    );

    // Sign in as ann; the page now offers actions and carries the CSRF token.
    let r = post(
        "/signin",
        None,
        form(&[("name", "ann"), ("token", "s3cret-admin-token")]),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().to_string();
    let page = c
        .get(format!("{base}/"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("signed in as <strong>ann</strong>"), "{page}");
    assert!(page.contains("action=\"/actions/preview\""));
    assert!(
        !page.contains("http-equiv=\"refresh\""),
        "no reload under a typing person"
    );
    let csrf = csrf_of(&page);

    // Without the CSRF token: 403, nothing shown, nothing done.
    let claim = "payments\t\tpaid-1";
    let r = post(
        "/actions/apply",
        Some(&cookie),
        form(&[("action", "complete"), ("note", "x"), ("claim", claim)]),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 403);

    // A resolve without a note is refused at the preview.
    let r = post(
        "/actions/preview",
        Some(&cookie),
        form(&[
            ("csrf", &csrf),
            ("action", "complete"),
            ("note", ""),
            ("claim", claim),
        ]),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);

    // Preview: what will happen, to which claim; nothing changed yet.
    let note = "seen at the provider as pi_123";
    let r = post(
        "/actions/preview",
        Some(&cookie),
        form(&[
            ("csrf", &csrf),
            ("action", "complete"),
            ("note", note),
            ("claim", claim),
        ]),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let preview = r.text().await.unwrap();
    assert!(preview.contains("resolve as completed") && preview.contains("payments/paid-1"));
    assert!(preview.contains("1 claim"), "{preview}");
    let c1 = s.get("payments", "", "paid-1").await.unwrap().unwrap();
    assert_eq!(
        c1.state,
        ClaimState::NeedsAttention,
        "a preview changes nothing"
    );

    // Confirm: completed, recorded as page:ann with the note.
    let r = post(
        "/actions/apply",
        Some(&cookie),
        form(&[
            ("csrf", &csrf),
            ("action", "complete"),
            ("note", note),
            ("claim", claim),
        ]),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.unwrap().contains("now completed"));
    let c1 = s.get("payments", "", "paid-1").await.unwrap().unwrap();
    assert_eq!(c1.state, ClaimState::Completed);
    let events = s.events(c1.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.actor == "page:ann" && e.detail.as_deref().unwrap_or("").contains("pi_123")),
        "{events:?}"
    );

    // Bulk: every parked claim of payments whose reason starts with "previous attempt".
    let bulk = [
        ("csrf", csrf.as_str()),
        ("consumer", "payments"),
        ("reason", "previous attempt"),
        ("action", "redrive"),
        ("note", ""),
    ];
    let r = post("/actions/preview", Some(&cookie), form(&bulk))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let preview = r.text().await.unwrap();
    assert!(preview.contains("2 claims"), "{preview}");
    assert!(preview.contains("payments/lost-1") && preview.contains("payments/lost-2"));
    assert!(!preview.contains("paid-1"), "only the matching reason");
    // The confirm form carries exactly the claims shown; post it as the browser would.
    let mut fields: Vec<(String, String)> = vec![
        ("csrf".into(), csrf.clone()),
        ("action".into(), "redrive".into()),
        ("note".into(), "".into()),
    ];
    for id in ["lost-1", "lost-2"] {
        // consumer, tenant, message id and the attempt shown, tab-separated.
        let start = format!("value=\"payments\t\t{id}\t");
        let at = preview.find(&start).unwrap_or_else(|| panic!("{preview}"));
        let value = &preview[at + "value=\"".len()..];
        let value = &value[..value.find('"').unwrap()];
        assert!(
            value.rsplit('\t').next().unwrap().parse::<i32>().is_ok(),
            "{value:?}"
        );
        fields.push(("claim".into(), value.to_string()));
    }
    let r = post(
        "/actions/apply",
        Some(&cookie),
        serde_urlencoded::to_string(&fields).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    for id in ["lost-1", "lost-2"] {
        let c = s.get("payments", "", id).await.unwrap().unwrap();
        assert_eq!(c.state, ClaimState::Started, "{id} redriven");
        assert_eq!(c.attempt, 2);
        let events = s.events(c.id).await.unwrap();
        assert!(events.iter().any(|e| e.actor == "page:ann"), "{events:?}");
    }
    running.shutdown(std::time::Duration::from_secs(2)).await;
}

/// A form read before the claim moved away and back (parked → pending → parked by the
/// provider's events, same attempt) is refused with the version it showed and the one now,
/// and the claim stays as the events left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_read_before_the_claim_moved_is_refused() {
    use claimd::store::Settlement;
    let (_store, _sandbox, running) = payments_worker("admin_token = \"s3cret-admin-token\"").await;
    let base = format!("http://{}", running.http_addr);
    let s = running.app().store.clone();
    parked_claim(&s, "payments", "aba-1", "outcome unknown (timeout)").await;
    let c = no_redirects();
    let r = c
        .post(format!("{base}/signin"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form(&[("name", "ann"), ("token", "s3cret-admin-token")]))
        .send()
        .await
        .unwrap();
    let set = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().to_string();
    let page = c
        .get(format!("{base}/"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&page);
    // The claim as the page showed it, in the form's hidden field.
    let start = "value=\"payments\t\taba-1\t";
    let at = page.find(start).unwrap_or_else(|| panic!("{page}"));
    let shown = &page[at + "value=\"".len()..];
    let shown = shown[..shown.find('"').unwrap()].to_string();

    // The provider's events: it is processing after all, then it needs the customer again.
    let events = claimd::engine::settle::Settler::new(
        s.clone(),
        "event".into(),
        std::sync::Arc::new(claimd::engine::metrics::Metrics::new()),
    );
    for (from, to) in [
        (ClaimState::NeedsAttention, ClaimState::Pending),
        (ClaimState::Pending, ClaimState::NeedsAttention),
    ] {
        let read = s.get("payments", "", "aba-1").await.unwrap().unwrap();
        let moved = Settlement {
            state: Some(to),
            error: Some("requires_action".into()),
            ..Default::default()
        };
        assert!(
            events
                .settle_from(&read, from, moved, "event", to.as_str())
                .await
                .unwrap()
        );
    }

    let r = c
        .post(format!("{base}/actions/apply"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("Cookie", &cookie)
        .body(form(&[
            ("csrf", &csrf),
            ("action", "complete"),
            ("note", "paid per the provider"),
            ("claim", &shown),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let said = r.text().await.unwrap();
    assert!(
        said.contains("the claim changed since you read it (version ") && said.contains("reload"),
        "{said}"
    );
    let now = s.get("payments", "", "aba-1").await.unwrap().unwrap();
    assert_eq!(now.state, ClaimState::NeedsAttention);
    assert!(
        s.events(now.id)
            .await
            .unwrap()
            .iter()
            .all(|e| e.actor != "page:ann"),
        "a refused action leaves no line"
    );
    running.shutdown(std::time::Duration::from_secs(2)).await;
}
