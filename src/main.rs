//! The `claimd` binary: parses arguments, calls the library, prints what it returns.

use clap::{CommandFactory, FromArgMatches};
use std::io::Write;

/// `claimd --version`: the version, and the commit of a release build (`build.rs`).
fn version() -> String {
    let v = env!("CARGO_PKG_VERSION");
    match option_env!("CLAIMD_COMMIT") {
        Some(commit) => format!("{v} (commit {commit})"),
        None => format!("{v} (development build: commit not recorded)"),
    }
}

fn main() {
    claimd::service::run::return_large_buffers_to_the_system();
    let version: &'static str = Box::leak(version().into_boxed_str());
    let matches = claimd::cli::Cli::command().version(version).get_matches();
    let cli = claimd::cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The runtime and every future run inside the library (`execute_blocking`): polled here,
    // they would be compiled a second time into the binary.
    let out = claimd::cli::execute_blocking(cli);
    let _ = std::io::stdout().write_all(out.stdout.as_bytes());
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    std::process::exit(out.code);
}
