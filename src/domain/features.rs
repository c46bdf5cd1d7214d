//! The parts of claimd a build can leave out (Cargo features), and how their absence is worded.

/// The message for a part this build left out: `feature` is the Cargo feature that has it.
pub fn missing(feature: &str) -> String {
    format!("claimd was built without the `{feature}` Cargo feature")
}
