//! The build before this release's changes, for the mixed-version test: built once from its
//! commit (`git archive` of this repository, `cargo build --locked --bin claimd`) into
//! `~/.cache/claimd/previous/<commit>/` and reused after. The first build takes a few minutes.

use super::Worker;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The commit of the previous build: the last one before 0.2.0's rolling-upgrade work that
/// can run beside newer expand-only migrations (it has the schema window).
pub const PREVIOUS: &str = "8de5ad87aae28a263899138812fc537e49773b59";

/// The previous build's `claimd`, built on first use. `None` (with the reason printed) when
/// this checkout has no git history to build it from; under `CI=true` that is a failure.
pub fn previous_claimd() -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    let dir = Path::new(&home)
        .join(".cache/claimd/previous")
        .join(&PREVIOUS[..12]);
    let bin = dir.join("claimd");
    if bin.exists() {
        return Some(bin);
    }
    let repo = env!("CARGO_MANIFEST_DIR");
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    let archived = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "git -C '{repo}' archive {PREVIOUS} | tar -x -C '{}'",
            src.display()
        ))
        .status()
        .is_ok_and(|s| s.success())
        && src.join("Cargo.toml").exists();
    if !archived {
        let why = format!("commit {PREVIOUS} is not in this checkout's git history");
        assert!(std::env::var("CI").is_err(), "{why}");
        eprintln!("skipped: {why}");
        return None;
    }
    eprintln!(
        "building the previous claimd ({}) once, into {}",
        &PREVIOUS[..12],
        dir.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--locked", "--bin", "claimd"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        // No debug info: a quicker build of a binary nobody steps through.
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .stdout(Stdio::null())
        .status()
        .expect("cargo");
    assert!(built.success(), "the previous claimd did not build");
    std::fs::copy(dir.join("target/debug/claimd"), &bin).unwrap();
    Some(bin)
}

/// `bin run --config config`, once it answers `/readyz` on `port`.
pub async fn spawn_ready(bin: &Path, config: &Path, port: u16, log: &Path) -> Worker {
    let w = Worker::spawn_bin(bin, config, port, log).await;
    assert!(
        w.ready_within(Duration::from_secs(60)).await,
        "{} did not become ready on port {port}",
        bin.display()
    );
    w
}
