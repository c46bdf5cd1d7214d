//! The commands the operator page suggests for a claim of the attention list.

use crate::claim::ClaimState;
use crate::report::AttentionItem;
use std::fmt::Write as _;

/// Quotes a word for a POSIX shell (and zsh) so a pasted command passes it verbatim: plain
/// words stay as they are; anything else goes in single quotes.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+,".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A `claimd claims SUB CONSUMER MESSAGE_ID [OPTIONS] [--tenant T]` command line, quoted for a
/// shell. Ids that start with `-` would read as options, so then the options come first and
/// `--` ends them.
fn claims_command(sub: &str, item: &AttentionItem, options: &[&str]) -> String {
    let mut opts: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    if !item.tenant.is_empty() {
        let sep = if item.tenant.starts_with('-') {
            "="
        } else {
            " "
        };
        opts.push(format!("--tenant{sep}{}", shell_quote(&item.tenant)));
    }
    let positional = format!(
        "{} {}",
        shell_quote(&item.consumer),
        shell_quote(&item.message_id)
    );
    let mut cmd = format!("claimd claims {sub}");
    if item.consumer.starts_with('-') || item.message_id.starts_with('-') {
        for o in &opts {
            let _ = write!(cmd, " {o}");
        }
        let _ = write!(cmd, " -- {positional}");
    } else {
        let _ = write!(cmd, " {positional}");
        for o in &opts {
            let _ = write!(cmd, " {o}");
        }
    }
    cmd
}

/// What an operator can do about one claim of the attention list: (when, command), in the
/// order to try them. Plain text; the page escapes it.
pub fn commands_for(item: &AttentionItem) -> Vec<(&'static str, String)> {
    let show = ("look first", claims_command("show", item, &[]));
    if item.state == ClaimState::Started.as_str() {
        vec![show, ("run a sweeper pass now", "claimd sweep".to_string())]
    } else {
        vec![
            show,
            (
                "the provider has the effect",
                claims_command("resolve", item, &["--as completed", "--note \"...\""]),
            ),
            (
                "the provider has no record of it",
                claims_command("redrive", item, &[]),
            ),
        ]
    }
}
