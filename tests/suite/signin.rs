//! Browser sign-in (issue 15): the admin token entered once on `/signin` becomes an HttpOnly,
//! SameSite=Strict session cookie with an expiry; the page then opens with it, actions from it
//! need the session's CSRF token, a wrong token or a forged cookie gets nothing, sign-out
//! clears the cookie, and the bearer header keeps working for scripts.

use crate::common;

use common::*;
use serde_json::json;

fn no_redirects() -> reqwest::Client {
    claimd::provider::tls::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_opens_the_page_and_actions_need_the_csrf_token() {
    let (_store, _sandbox, running) = payments_worker("admin_token = \"s3cret-admin-token\"").await;
    let base = format!("http://{}", running.http_addr);
    let c = no_redirects();

    // A browser that is not signed in is sent to the form; a script gets 401 JSON.
    let r = c
        .get(format!("{base}/"))
        .header("Accept", "text/html,application/xhtml+xml")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/signin");
    let r = c.get(format!("{base}/v1/claims")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let form = c.get(format!("{base}/signin")).send().await.unwrap();
    assert_eq!(form.status().as_u16(), 200);
    assert!(form.text().await.unwrap().contains("name=\"token\""));

    // A wrong token: 401, the form again, no cookie.
    let r = c
        .post(format!("{base}/signin"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("name=ann&token=guess")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(r.headers().get("set-cookie").is_none());

    // The right token: a session cookie with the attributes a browser needs.
    let r = c
        .post(format!("{base}/signin"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("name=ann&token=s3cret-admin-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/");
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    for attr in [
        "claimd_session=v2.",
        "HttpOnly",
        "SameSite=Strict",
        "Max-Age=28800",
        "Path=/",
    ] {
        assert!(set.contains(attr), "{attr} missing: {set}");
    }
    let cookie = set.split(';').next().unwrap().to_string();

    // The page and the read API open with the cookie.
    let r = c
        .get(format!("{base}/"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let page = r.text().await.unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page's forms carry the CSRF token")
        .to_string();
    let r = c
        .get(format!("{base}/v1/claims"))
        .header("Cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // A forged cookie (another expiry with the old MAC) gets nothing.
    let parts: Vec<&str> = cookie.split('.').collect();
    let forged = format!("{}.9999999999.{}", parts[0], parts[2..].join("."));
    let r = c
        .get(format!("{base}/v1/claims"))
        .header("Cookie", &forged)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);

    // An action with the cookie but without the CSRF token is refused (403) and does nothing.
    let redrive = format!("{base}/v1/claims/payments/nobody/redrive");
    let r = c
        .post(&redrive)
        .header("Cookie", &cookie)
        .json(&json!({"actor":"ann"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("CSRF"));
    let r = c
        .post(&redrive)
        .header("Cookie", &cookie)
        .header("X-CSRF-Token", "not-the-token")
        .json(&json!({"actor":"ann"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);

    // The bearer header needs no CSRF token (it reaches the route: no such claim).
    let r = c
        .post(&redrive)
        .bearer_auth("s3cret-admin-token")
        .json(&json!({"actor":"script"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);

    // Sign-out (with the page's CSRF token, as its button sends it) clears the cookie.
    let r = c
        .post(format!("{base}/signout"))
        .header("Cookie", &cookie)
        .header("X-CSRF-Token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let cleared = r.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cleared.starts_with("claimd_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    running.shutdown(std::time::Duration::from_secs(2)).await;
}
