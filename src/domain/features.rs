//! The parts of claimd a build can leave out (Cargo features), and how their absence is worded.

/// The command that builds claimd with `feature` (the default features plus it).
pub fn build_with(feature: &str) -> String {
    format!("cargo build --release --features {feature}")
}

/// The message for a part this build left out: `feature` is the Cargo feature that has it, and
/// the message names the command that builds claimd with it.
pub fn missing(feature: &str) -> String {
    format!(
        "claimd was built without the `{feature}` Cargo feature; build it with `{}` \
         (or `--features full`: every part)",
        build_with(feature)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_feature_and_the_command_that_builds_it() {
        assert_eq!(
            missing("amqp"),
            "claimd was built without the `amqp` Cargo feature; build it with \
             `cargo build --release --features amqp` (or `--features full`: every part)"
        );
    }
}
