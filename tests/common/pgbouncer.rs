//! A private PgBouncer in transaction mode in front of the test PostgreSQL: Debian's
//! `pgbouncer` (1.18 here, no prepared-statement support in transaction mode), on a free
//! loopback port, its configuration and log in a temporary folder, run as user `postgres`
//! (through `runuser`) when the tests run as root, which PgBouncer refuses.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running PgBouncer, stopped on drop.
pub struct Bouncer {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Bouncer {
    /// Starts one whose every database is the test server's (`CLAIMD_TEST_PG`), with
    /// `pool_size` server connections per database and user: few, so that clients share
    /// them. `None` (a skip, printed) when `pgbouncer` is not installed; under `CI=true`
    /// that is a failure.
    pub fn start(pool_size: u32) -> Option<Bouncer> {
        let Some(bin) = binary() else {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("pgbouncer is required under CI=true (.ci/run installs it)");
            }
            eprintln!("SKIPPED: pgbouncer is not installed (apt-get install pgbouncer)");
            return None;
        };
        let admin = super::pg_admin_url();
        let (user, host, upstream) = parts(&admin);
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(dir.path().join("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let ini = format!(
            "[databases]\n\
             * = host={host} port={upstream}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 1000\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {log}\n\
             pidfile = {pid}\n",
            users = path("users.txt"),
            log = path("pgbouncer.log"),
            pid = path("pgbouncer.pid"),
        );
        let config = dir.path().join("pgbouncer.ini");
        std::fs::write(&config, ini).unwrap();
        let mut command = if is_root() {
            let owned = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .expect("chown the pgbouncer folder");
            assert!(
                owned.success(),
                "chown -R postgres {}",
                dir.path().display()
            );
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = command
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let bouncer = Bouncer { dir, port, child };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer did not listen on {port}: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(bouncer)
    }

    /// `url` (a database of the test server) reached through this PgBouncer.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a database URL");
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let user = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
        format!(
            "{scheme}://{}127.0.0.1:{}/{path}",
            user.unwrap_or_default(),
            self.port
        )
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // runuser passes SIGTERM on to pgbouncer, which then exits.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The user, host and port of a `postgres://user[:password]@host[:port]/db` URL.
fn parts(url: &str) -> (String, String, u16) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    let (user, hostport) = authority
        .rsplit_once('@')
        .unwrap_or(("postgres", authority));
    let user = user.split_once(':').map_or(user, |(u, _)| u);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().unwrap_or(5432)),
        None => (hostport, 5432),
    };
    (user.to_string(), host.to_string(), port)
}

fn binary() -> Option<PathBuf> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
