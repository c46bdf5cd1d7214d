//! The command line where people look first (issue 15): `--state` and `--as` list their
//! allowed values, `report --since` defaults to `24h` as README says, and a database that was
//! never migrated is answered with what to run.

mod common;

use common::*;

#[test]
fn choices_are_listed_and_an_unmigrated_database_says_to_migrate() {
    let (code, _, err) = cli(&["claims", "list", "--state", "parked"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("started, completed, failed, needs_attention"),
        "{err}"
    );
    let (code, _, err) = cli(&["claims", "resolve", "p", "m", "--as", "done", "--note", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("completed, failed"), "{err}");
    let (_, help, _) = cli(&["report", "--help"]);
    assert!(help.contains("[default: 24h]"), "{help}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\nurl = \"sqlite://{}\"\n",
            dir.path().join("empty.db").display()
        ),
    )
    .unwrap();
    let cfg = cfg.to_string_lossy().into_owned();
    let (code, _, err) = cli(&["--config", &cfg, "report"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no claimd tables yet") && err.contains(&format!("--config {cfg} migrate")),
        "{err}"
    );
    let (code, _, err) = cli(&["--config", &cfg, "migrate"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&["--config", &cfg, "report"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty());
}
