//! Two things the crate embeds:
//! - the migrations under `migrations/<dialect>/`, listed for `store::embedded_migrations`
//!   (`$OUT_DIR/migrations_<dialect>.rs`): sqlx's `migrate!` macro would do it, but its
//!   `macros` feature builds sqlx and SQLite a second time for the compiler
//!   (docs/decisions.md, "The first build");
//! - the git commit a release build is made from, for `claimd --version` (docs/decisions.md,
//!   "The commit in --version"). Only for the release profile: a development build would
//!   otherwise rebuild the whole crate at every commit. The commit comes from `CLAIMD_COMMIT`
//!   when set, then `git`, then the `.cargo_vcs_info.json` that `cargo package` writes into a
//!   published crate.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// `"sha1": "<40 hex>"` in a packaged crate's `.cargo_vcs_info.json`.
fn packaged() -> Option<String> {
    let text = std::fs::read_to_string(".cargo_vcs_info.json").ok()?;
    let at = text.find("\"sha1\"")?;
    let rest = &text[at + 6..];
    let start = rest.find('"')? + 1;
    let len = rest[start..].find('"')?;
    Some(rest[start..start + len].chars().take(12).collect())
}

/// Writes `$OUT_DIR/migrations_<dialect>.rs`: an array of (file name, SQL) in version order.
fn list_migrations(dialect: &str) {
    let dir = std::path::Path::new("migrations").join(dialect);
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sql"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let mut out = String::from("&[\n");
    for f in &files {
        let path = std::path::Path::new(&manifest).join(&dir).join(f);
        out.push_str(&format!(
            "    ({f:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("]\n");
    let target = std::path::Path::new(&std::env::var("OUT_DIR").unwrap())
        .join(format!("migrations_{dialect}.rs"));
    std::fs::write(target, out).unwrap();
}

fn main() {
    list_migrations("postgres");
    list_migrations("sqlite");
    println!("cargo:rerun-if-env-changed=CLAIMD_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("PROFILE").as_deref() != Ok("release") {
        return;
    }
    let commit = std::env::var("CLAIMD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
            // Rebuild when HEAD moves: a commit, a checkout.
            if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
                println!("cargo:rerun-if-changed={dir}/HEAD");
            }
            if let (Some(common), Some(head)) = (
                git(&["rev-parse", "--git-common-dir"]),
                git(&["symbolic-ref", "-q", "HEAD"]),
            ) {
                println!("cargo:rerun-if-changed={common}/{head}");
                println!("cargo:rerun-if-changed={common}/packed-refs");
            }
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
            Some(if dirty {
                format!("{commit}-modified")
            } else {
                commit
            })
        })
        .or_else(packaged);
    if let Some(commit) = commit {
        println!("cargo:rustc-env=CLAIMD_COMMIT={commit}");
    }
}
