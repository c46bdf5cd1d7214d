//! Multi-host PostgreSQL URLs, as libpq reads them: `postgres://u@h1:5432,h2:5432/db?
//! target_session_attrs=read-write` names the servers to try in order, and the session
//! attribute says which of them may be used. The driver (sqlx) reads neither, so claimd splits
//! such a URL into one single-host URL a server ([`split_hosts`]) and finds the primary itself
//! (the PostgreSQL driver's failover monitor).

/// Which server a session may use, from `target_session_attrs`. claimd writes claims, so
/// only the two values that mean "a server that takes writes" are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    /// `read-write` (what claimd checks when the parameter is absent): a session whose
    /// `transaction_read_only` is off.
    ReadWrite,
    /// `primary`: a server not in recovery.
    Primary,
}

impl SessionAttrs {
    /// The parameter's value.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::Primary => "primary",
        }
    }
}

/// A store URL split by server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTargets {
    /// One URL a server, in the order given, each without `target_session_attrs` (the driver
    /// does not read it).
    pub urls: Vec<String>,
    /// `host:port` of each, for logs and `/readyz`.
    pub labels: Vec<String>,
    /// Which server may be used.
    pub attrs: SessionAttrs,
}

/// Splits a `postgres://` URL by the hosts of its authority (`h1:5432,h2:5433`) and takes
/// `target_session_attrs` out of its query. A URL with one host gives one URL. Errors are
/// plain words for the configuration check; they never quote the URL (it may hold a password).
pub fn split_hosts(url: &str) -> Result<HostTargets, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("not a URL (no ://)".into());
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let mut attrs = SessionAttrs::ReadWrite;
    let mut kept = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "target_session_attrs" => attrs = parse_attrs(v)?,
            "host" | "port" if v.contains(',') || v.contains("%2C") || v.contains("%2c") => {
                return Err(format!(
                    "a list in the {k}= parameter is not read; name the servers in the URL's \
                     authority instead: postgres://user@host1:5432,host2:5432/db"
                ));
            }
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let hosts: Vec<&str> = hostlist.split(',').collect();
    if hosts.len() > 1 && hosts.iter().any(|h| h.is_empty()) {
        return Err("an empty host in the host list".into());
    }
    let urls = hosts
        .iter()
        .map(|h| format!("{scheme}://{userinfo}{h}{path}{query}"))
        .collect();
    let labels = hosts
        .iter()
        .map(|h| match h {
            &"" => "localhost:5432".to_string(),
            h if h.ends_with(']') || !h.contains(':') => format!("{h}:5432"),
            h => h.to_string(),
        })
        .collect();
    Ok(HostTargets {
        urls,
        labels,
        attrs,
    })
}

fn parse_attrs(v: &str) -> Result<SessionAttrs, String> {
    match v {
        "read-write" => Ok(SessionAttrs::ReadWrite),
        "primary" => Ok(SessionAttrs::Primary),
        "any" | "read-only" | "standby" | "prefer-standby" => Err(format!(
            "target_session_attrs={v} is refused: claimd writes every claim, so it needs \
             read-write (or primary)"
        )),
        _ => Err(format!(
            "target_session_attrs={v:?} is not a value libpq knows; claimd takes read-write or \
             primary"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_becomes_one_url_a_server_in_order() {
        let t = split_hosts(
            "postgres://claimd:pw@db1:5432,db2:5433/claims?sslmode=require&target_session_attrs=primary",
        )
        .unwrap();
        assert_eq!(
            t.urls,
            [
                "postgres://claimd:pw@db1:5432/claims?sslmode=require",
                "postgres://claimd:pw@db2:5433/claims?sslmode=require"
            ]
        );
        assert_eq!(t.labels, ["db1:5432", "db2:5433"]);
        assert_eq!(t.attrs, SessionAttrs::Primary);
    }

    #[test]
    fn one_host_is_kept_as_it_is_and_read_write_is_the_default() {
        let t = split_hosts("postgres://claimd@db/claims").unwrap();
        assert_eq!(t.urls, ["postgres://claimd@db/claims"]);
        assert_eq!(t.labels, ["db:5432"]);
        assert_eq!(t.attrs, SessionAttrs::ReadWrite);
        let t =
            split_hosts("postgresql://[::1]:6000,[::2]/x?target_session_attrs=read-write").unwrap();
        assert_eq!(
            t.urls,
            ["postgresql://[::1]:6000/x", "postgresql://[::2]/x"]
        );
        assert_eq!(t.labels, ["[::1]:6000", "[::2]:5432"]);
    }

    #[test]
    fn attributes_that_allow_a_standby_and_lists_in_parameters_are_refused() {
        for v in ["any", "standby", "read-only", "prefer-standby"] {
            let e = split_hosts(&format!("postgres://a,b/x?target_session_attrs={v}")).unwrap_err();
            assert!(e.contains("read-write"), "{e}");
        }
        let e = split_hosts("postgres://u@x/db?target_session_attrs=rw").unwrap_err();
        assert!(e.contains("not a value libpq knows"), "{e}");
        let e = split_hosts("postgres:///db?host=a,b").unwrap_err();
        assert!(e.contains("authority"), "{e}");
        assert!(split_hosts("postgres://a,,b/db").is_err());
        // A password never appears in an error.
        let e = split_hosts("postgres://u:hunter2@a,b/db?target_session_attrs=any").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
