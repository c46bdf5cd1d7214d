//! Who an operator command is recorded as, in the claim's history. An action nobody can be
//! named for is refused: a bare "operator" in the history of a payment says nothing when a
//! cron job or a container without `$USER` acted.

/// The environment variables read, in order.
pub const ACTOR_VARS: [&str; 2] = ["CLAIMD_OPERATOR", "USER"];

/// `operator:<name>` from the first of [`ACTOR_VARS`] that is set and not blank, else why the
/// action is refused (one line, naming what to set).
pub fn operator_name() -> Result<String, String> {
    actor_from(|k| std::env::var(k).ok())
}

/// [`operator_name`] over any environment (pure, for tests).
pub fn actor_from(env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    ACTOR_VARS
        .iter()
        .filter_map(|k| env(k))
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
        .map(|u| format!("operator:{u}"))
        .ok_or_else(|| {
            "who acts is recorded in the claim's history, and neither CLAIMD_OPERATOR nor USER \
             is set: set CLAIMD_OPERATOR to your name (a cron job: its owner's); nothing was done"
                .to_string()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_without_a_known_actor_is_refused() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            actor_from(env(&[("USER", "ann"), ("CLAIMD_OPERATOR", "bob")])).unwrap(),
            "operator:bob"
        );
        assert_eq!(actor_from(env(&[("USER", "ann")])).unwrap(), "operator:ann");
        assert_eq!(
            actor_from(env(&[("CLAIMD_OPERATOR", " "), ("USER", "ann")])).unwrap(),
            "operator:ann"
        );
        let err = actor_from(env(&[])).unwrap_err();
        assert!(err.contains("set CLAIMD_OPERATOR"), "{err}");
    }
}
