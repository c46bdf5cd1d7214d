//! `GET /signin`, `POST /signin` and `POST /signout`: the operator page's sign-in (see
//! [`super::session`] for the cookie). The form takes the admin token once; a wrong token is
//! answered `401` with the form again and no cookie.

use super::auth::constant_time_eq;
use super::session::{self, SESSION_TTL, Session};
use super::state::AppState;
use axum::Form;
use axum::extract::State;
use axum::extract::rejection::FormRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

/// The sign-in form's fields.
#[derive(Debug, Deserialize)]
pub struct SignIn {
    /// Who signs in, recorded in the history of what they do.
    #[serde(default)]
    pub name: String,
    /// The admin token.
    pub token: String,
}

const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>claimd — sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font:16px system-ui,sans-serif;margin:4rem auto;max-width:26rem;color:#1d2733}
h1{font-size:1.4rem}label{display:block;margin:1rem 0 .3rem}input[type=password]{width:100%;padding:.5rem;font:inherit}
button{margin-top:1rem;padding:.5rem 1.2rem;font:inherit}.error{color:#a11;margin:1rem 0}</style></head>
<body><h1>claimd operator page</h1>{message}
<form method="post" action="/signin"><label for="name">Your name (recorded with what you do: letters, digits, <code>._@-</code>)</label>
<input id="name" name="name" type="text" autocomplete="username" pattern="[A-Za-z0-9._@-]{1,64}" required autofocus>
<label for="token">Admin token (<code>[http] admin_token</code>)</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button></form>
<p>Signed in for 8 hours in this browser. Scripts send <code>Authorization: Bearer &lt;token&gt;</code> instead.</p>
</body></html>"#;

fn page(status: StatusCode, message: &str) -> Response {
    (status, Html(PAGE.replace("{message}", message))).into_response()
}

fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

/// `GET /signin`: the form (or straight to the page when no admin token is configured).
pub async fn form(State(state): State<AppState>) -> Response {
    if state.config.http.admin_token.is_empty() {
        return see_other("/");
    }
    page(StatusCode::OK, "")
}

/// `POST /signin`: checks the token; sets the session cookie and goes to the page.
pub async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<SignIn>, FormRejection>,
) -> Response {
    let expected = &state.config.http.admin_token;
    if expected.is_empty() {
        return see_other("/");
    }
    let Ok(Form(given)) = form else {
        return page(
            StatusCode::BAD_REQUEST,
            r#"<p class="error" role="alert">Enter your name and the admin token.</p>"#,
        );
    };
    let name = given.name.trim();
    if !session::valid_name(name) {
        return page(
            StatusCode::BAD_REQUEST,
            r#"<p class="error" role="alert">The name must be 1-64 letters, digits or ._@-</p>"#,
        );
    }
    if !constant_time_eq(given.token.trim().as_bytes(), expected.as_bytes()) {
        tracing::warn!("operator page sign-in refused: wrong admin token");
        return page(
            StatusCode::UNAUTHORIZED,
            r#"<p class="error" role="alert">That is not the admin token.</p>"#,
        );
    }
    let value = Session::issue(
        expected,
        chrono::Utc::now().timestamp(),
        SESSION_TTL,
        &session::new_nonce(),
        name,
    );
    let secure = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let mut r = see_other("/");
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&value, secure)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `POST /signout`: clears the cookie and goes back to the form.
pub async fn sign_out() -> Response {
    let mut r = see_other("/signin");
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
