//! What the page's templates share: the stylesheet compiled in, and text from clients and
//! providers made visible. The page (`render`) and its forms (`actions`) both use these, so
//! they live apart from either.

/// The page's stylesheet, compiled into the binary: the page loads no external asset.
pub(super) const CSS: &str = include_str!("page.css");

/// Text from a client or provider as the page shows it: control and bidi characters written
/// out visibly ([`crate::table::escape_controls`]; a right-to-left override in a reason would
/// otherwise reorder what an operator reads), then HTML-escaped by the template.
pub fn visible(s: &str) -> std::borrow::Cow<'_, str> {
    crate::table::escape_controls(s)
}
