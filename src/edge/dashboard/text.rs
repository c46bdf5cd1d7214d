//! What the page's templates share: the stylesheet compiled in, and text from clients and
//! providers made visible. The page (`render`) and its forms (`actions`) both use these, so
//! they live apart from either.

/// The page's stylesheet, compiled into the binary: the page loads no external asset.
pub(super) const CSS: &str = include_str!("page.css");

/// Text from a client or provider as the page shows it: control and bidi characters written
/// out visibly ([`crate::domain::table::escape_controls`]; a right-to-left override in a reason would
/// otherwise reorder what an operator reads), then HTML-escaped by the template.
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    crate::domain::table::escape_controls(s)
}

/// A duration for people: `0.4s`, `12s`, `4m 12s`, `3h 05m`, `2d 04h`.
pub fn human_secs(s: f64) -> String {
    if !s.is_finite() {
        return "-".into();
    }
    let s = s.max(0.0);
    if s < 1.0 {
        // p50 of a fast provider is a few ms: "0s" would say nothing.
        return format!("{}ms", (s * 1000.0).round());
    }
    if s < 10.0 {
        let t = format!("{s:.1}");
        return format!("{}s", t.strip_suffix(".0").unwrap_or(&t));
    }
    let n = s.round() as u64;
    match n {
        0..60 => format!("{n}s"),
        60..3600 => format!("{}m {:02}s", n / 60, n % 60),
        3600..86400 => format!("{}h {:02}m", n / 3600, n % 3600 / 60),
        _ => format!("{}d {:02}h", n / 86400, n % 86400 / 3600),
    }
}
