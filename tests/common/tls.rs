//! Test certificates for the brokers' TLS tests, made with the `openssl` command.

use std::path::Path;
use std::process::{Command, Stdio};

/// A CA and a certificate for `localhost` signed by it, in `dir`: (ca.pem, server.pem,
/// server.key). `None` (with `SKIPPED:` printed) when `openssl` cannot make them.
pub fn certificates(dir: &Path) -> Option<()> {
    let openssl = |args: &[&str]| {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=claimd test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    ];
    let made = steps.iter().all(|s| openssl(s));
    if !made {
        // CI installs openssl (.ci/run): there a missing one is a failure, not a skip.
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "the openssl command could not make test certificates"
        );
        eprintln!("SKIPPED: the openssl command could not make test certificates");
    }
    made.then_some(())
}
