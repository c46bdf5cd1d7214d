//! Configuration tests: loading, overrides, expansion and every refusal.

use super::*;
use crate::domain::claim::KeyTemplate;
use std::time::Duration;

const BASE: &str = r#"
[store]
url = "sqlite://x.db"
[[consumers]]
name = "payments"
source = "http"
lease = "60s"
[consumers.effect]
kind = "http"
url = "http://127.0.0.1:8090/v1/payments"
timeout = "10s"
headers = { Authorization = "Bearer ${PROVIDER_TOKEN:-none}" }
"#;

/// [`BASE`] with the provider secret written without a default.
fn strict() -> String {
    BASE.replace("${PROVIDER_TOKEN:-none}", "${PROVIDER_TOKEN}")
}

fn load(text: &str, env: &[(&str, &str)]) -> Result<Loaded, ConfigError> {
    Config::from_toml(
        text,
        Path::new("c.toml"),
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
    )
}

#[test]
fn loads_with_defaults_and_expands_secrets() {
    let l = load(BASE, &[("PROVIDER_TOKEN", "s3cret")]).unwrap();
    let c = &l.config.consumers[0];
    assert_eq!(c.max_attempts, 8);
    assert_eq!(c.on_unknown, OnUnknown::Reconcile);
    let EffectConfig::Http(h) = &c.effect else {
        panic!("http effect")
    };
    assert_eq!(h.headers["Authorization"], "Bearer s3cret");
}

#[test]
fn an_unset_secret_in_a_provider_header_or_url_refuses_to_start() {
    for env in [&[][..], &[("PROVIDER_TOKEN", "")][..]] {
        let e = load(&strict(), env).unwrap_err().to_string();
        assert!(
            e.contains("consumers[0].effect.headers.Authorization")
                && e.contains("${PROVIDER_TOKEN} is not set"),
            "{e}"
        );
    }
    let in_url = strict().replace("/v1/payments", "/v1/${ACCOUNT}/payments");
    let e = load(&in_url, &[("PROVIDER_TOKEN", "s3cret")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("consumers[0].effect.url") && e.contains("${ACCOUNT}"),
        "{e}"
    );
}

#[test]
fn an_explicit_default_allows_an_empty_secret_and_elsewhere_unset_only_warns() {
    let explicit = strict().replace("${PROVIDER_TOKEN}", "${PROVIDER_TOKEN:-}");
    let l = load(&explicit, &[]).unwrap();
    let EffectConfig::Http(h) = &l.config.consumers[0].effect else {
        panic!("http effect")
    };
    assert_eq!(h.headers["Authorization"], "Bearer ");
    let token = BASE.replace("[store]", "[http]\nadmin_token = \"${ADMIN}\"\n[store]");
    let l = load(&token, &[("PROVIDER_TOKEN", "s3cret")]).unwrap();
    assert!(
        l.warnings
            .iter()
            .any(|w| w.contains("http.admin_token") && w.contains("ADMIN")),
        "{:?}",
        l.warnings
    );
}

#[test]
fn environment_overrides_reach_nested_keys() {
    let l = load(
        BASE,
        &[
            ("CLAIMD__STORE__MAX_CONNECTIONS", "4"),
            ("CLAIMD__CONSUMERS__0__EFFECT__TIMEOUT", "5s"),
            ("CLAIMD__HTTP__LISTEN", "127.0.0.1:9999"),
        ],
    )
    .unwrap();
    assert_eq!(l.config.store.max_connections, 4);
    assert_eq!(
        l.config.consumers[0].effect.timeout(),
        Duration::from_secs(5)
    );
    assert_eq!(l.config.http.listen, "127.0.0.1:9999");
}

fn error_of(text: &str) -> String {
    load(text, &[]).unwrap_err().to_string()
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let e = error_of(&BASE.replace("lease = \"60s\"", "lease = \"60s\"\nleese = 1"));
    assert!(e.contains("consumers[0]") && e.contains("leese"), "{e}");
    let e = error_of(&format!("{BASE}\n[sweeper]\nshedule = \"x\""));
    assert!(e.contains("shedule"), "{e}");
}

#[test]
fn bad_values_name_key_and_problem_on_one_line() {
    for (text, needle) in [
        (BASE.replace("\"60s\"", "\"sixty\""), "consumers[0].lease"),
        (
            BASE.replace("\"60s\"", "\"5s\""),
            "longer than the effect timeout",
        ),
        (
            BASE.replace("source = \"http\"", "source = \"kafka\""),
            "consumers[0].source",
        ),
        (
            BASE.replace("source = \"http\"", "source = \"amqp\""),
            // Without the feature, the source itself is refused first.
            if cfg!(feature = "amqp") {
                "amqp_url"
            } else {
                "--features amqp"
            },
        ),
        (
            format!("{BASE}\n[retention]\nkeep_terminal_for = \"1h\""),
            "redrive_within",
        ),
        (
            format!("{BASE}\n[retention]\nkeep_failed_for = \"1h\""),
            "retention.keep_failed_for",
        ),
        (
            format!("{BASE}\n[retention]\nkeep_completed_for = \"0s\""),
            "more than zero",
        ),
        (
            format!("{BASE}\n[retention]\narchive_after = \"2d\""),
            "PostgreSQL",
        ),
        (
            BASE.replace("sqlite://x.db", "postgres://h/db")
                + "\n[retention]\narchive_after = \"1h\"",
            "left for the archive",
        ),
        (
            BASE.replace("sqlite://x.db", "postgres://h/db")
                + "\n[retention]\narchive_after = \"14d\"",
            "not shorter than the window of keep_completed_for",
        ),
        (
            format!("{BASE}\n[sweeper]\nschedule = \"every minute\""),
            "sweeper.schedule",
        ),
        ("[store\nurl=1".to_string(), "not valid TOML"),
    ] {
        let e = error_of(&text);
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
        assert!(e.starts_with("c.toml: "), "{e}");
    }
}

#[test]
fn warns_when_two_consumers_share_a_provider_without_consumer_in_key() {
    let two = format!(
        "{BASE}\n[[consumers]]\nname = \"refunds\"\nsource = \"http\"\nkey = \"{{message_id}}\"\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:8090/v1/refunds\"\n"
    );
    let l = load(&two, &[("PROVIDER_TOKEN", "x")]).unwrap();
    assert!(
        l.warnings.iter().any(|w| w.contains("same provider")),
        "{:?}",
        l.warnings
    );
}

#[test]
fn the_default_key_template_keys_on_consumer_and_tenant() {
    let l = load(BASE, &[("PROVIDER_TOKEN", "x")]).unwrap();
    let c = &l.config.consumers[0];
    assert_eq!(c.key, "{consumer}:{tenant}:{message_id}");
    let t: KeyTemplate = c.key.parse().unwrap();
    assert_ne!(
        t.render(&c.name, "acme", "order-1"),
        t.render(&c.name, "globex", "order-1")
    );
    assert_eq!(c.effect.max_key_length(), 255);
}

#[test]
fn a_tenant_header_without_tenant_in_the_key_is_refused() {
    let text = BASE.replace(
        "lease = \"60s\"",
        "lease = \"60s\"\ntenant_header = \"X-Tenant\"\nkey = \"{message_id}\"",
    );
    let e = error_of(&text);
    assert!(e.contains("consumers[0].key"), "{e}");
    assert!(e.contains("lacks {tenant}"), "{e}");
    let ok = BASE.replace(
        "lease = \"60s\"",
        "lease = \"60s\"\ntenant_header = \"X-Tenant\"\nkey = \"{tenant}:{message_id}\"",
    );
    assert!(load(&ok, &[("PROVIDER_TOKEN", "x")]).is_ok());
}

#[test]
fn a_key_window_shorter_than_the_lease_is_refused() {
    let text = BASE.replace(
        "lease = \"60s\"",
        "lease = \"60s\"\nredrive_within = \"30s\"",
    );
    let e = error_of(&text);
    assert!(e.contains("consumers[0].redrive_within"), "{e}");
    assert!(e.contains("shorter than the lease"), "{e}");
    let e = error_of(&BASE.replace("timeout = \"10s\"", "timeout = \"10s\"\nmax_key_length = 0"));
    assert!(e.contains("consumers[0].effect.max_key_length"), "{e}");
}

/// A RabbitMQ consumer loads in a build with `amqp`; a build without it (the default) refuses
/// it, naming the key, the feature and the command that builds claimd with it.
#[test]
fn a_setting_whose_feature_the_build_left_out_is_refused_with_the_command_that_builds_it() {
    let text = "[store]\nurl = \"sqlite://x.db\"\n[[consumers]]\nname = \"a\"\nsource = \"amqp\"\namqp_url = \"amqp://x\"\nqueue = \"q.a\"\ndead_letter_exchange = \"dlx.a\"\nprefetch = 8\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:8090/v1/a\"\n";
    let loaded = load(text, &[]);
    if cfg!(feature = "amqp") {
        assert!(loaded.is_ok(), "{:?}", loaded.err());
    } else {
        let e = loaded.unwrap_err().to_string();
        assert!(e.contains("consumers[0].source"), "{e}");
        assert!(
            e.contains("`amqp` Cargo feature")
                && e.contains("`cargo build --release --features amqp`, or `--features full`"),
            "{e}"
        );
    }
}

#[test]
#[cfg(feature = "amqp")]
fn amqp_consumers_need_prefetch_and_a_dead_letter_exchange_of_their_own() {
    let amqp = |name: &str, dlx: &str, prefetch: u16| {
        format!(
            "\n[[consumers]]\nname = \"{name}\"\nsource = \"amqp\"\namqp_url = \"amqp://x\"\nqueue = \"q.{name}\"\ndead_letter_exchange = \"{dlx}\"\nprefetch = {prefetch}\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:8090/v1/{name}\"\n"
        )
    };
    let base = "[store]\nurl = \"sqlite://x.db\"\n";
    let e = error_of(&format!("{base}{}", amqp("a", "dlx.a", 0)));
    assert!(e.contains("consumers[0].prefetch"), "{e}");
    let e = error_of(&format!(
        "{base}{}{}",
        amqp("a", "dlx", 8),
        amqp("b", "dlx", 8)
    ));
    assert!(
        e.contains("consumers[1].dead_letter_exchange") && e.contains("\"a\""),
        "{e}"
    );
    assert!(
        load(
            &format!("{base}{}{}", amqp("a", "dlx.a", 8), amqp("b", "dlx.b", 8)),
            &[]
        )
        .is_ok()
    );
}

#[test]
#[cfg(all(feature = "amqp", feature = "smtp"))]
fn the_compose_overrides_reach_the_rabbitmq_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/postgres-rabbitmq.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let l = load(
        &text,
        &[
            (
                "CLAIMD__CONSUMERS__0__AMQP_URL",
                "amqp://claimd:claimd@rabbitmq:5672/%2f",
            ),
            ("CLAIMD__CONSUMERS__1__EFFECT__HOST", "mailpit"),
            ("CLAIMD__CONSUMERS__1__EFFECT__PORT", "1025"),
        ],
    )
    .unwrap();
    assert_eq!(
        l.config.consumers[0].amqp().unwrap().url,
        "amqp://claimd:claimd@rabbitmq:5672/%2f"
    );
    let EffectConfig::Smtp(s) = &l.config.consumers[1].effect else {
        panic!("consumers[1] is the email consumer")
    };
    assert_eq!((s.host.as_str(), s.port), ("mailpit", 1025));
}

#[test]
fn the_shipped_configs_load() {
    let read = |file: &str| {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
    };
    for file in ["config/default.toml", "config/postgres.toml"] {
        load(&read(file), &[]).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    // RabbitMQ and email: a build without them refuses it, saying how to build with them.
    let rabbitmq = load(&read("config/postgres-rabbitmq.toml"), &[]);
    if cfg!(all(feature = "amqp", feature = "smtp")) {
        rabbitmq.unwrap_or_else(|e| panic!("config/postgres-rabbitmq.toml: {e}"));
    } else {
        let e = rabbitmq.unwrap_err().to_string();
        assert!(e.contains("cargo build --release --features"), "{e}");
    }
}

#[test]
fn the_sandbox_s_published_webhook_secret_is_refused_for_a_real_provider() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "http://127.0.0.1:8090/v1/payments\"",
        "https://api.example.com/v1/payments\"",
    );
    let e = load(&text, &[]).unwrap_err().to_string();
    assert!(e.contains("provider_events.secrets"), "{e}");
    assert!(e.contains("published secret"), "{e}");
    // With the provider's own secret it loads.
    load(&text, &[("CLAIMD_SANDBOX_WEBHOOK_SECRET", "whsec_real")]).unwrap();
}

#[test]
fn a_section_left_out_has_the_same_defaults_as_one_given_empty() {
    let without = load(BASE, &[("PROVIDER_TOKEN", "x")]).unwrap().config;
    let with = load(
        &format!("{BASE}\n[http]\n[sweeper]\n[retention]\n[sandbox]\n[run]\n"),
        &[("PROVIDER_TOKEN", "x")],
    )
    .unwrap()
    .config;
    assert_eq!(without.sandbox.listen, "127.0.0.1:8090");
    assert_eq!(with.sandbox.listen, without.sandbox.listen);
    assert_eq!(with.http.listen, without.http.listen);
    assert_eq!(with.http.body_budget_bytes, without.http.body_budget_bytes);
    assert_eq!(with.sweeper.schedule, without.sweeper.schedule);
    assert_eq!(
        with.retention.keep_terminal_for.0,
        without.retention.keep_terminal_for.0
    );
    assert_eq!(with.run.shutdown_grace.0, without.run.shutdown_grace.0);
}

#[test]
#[cfg(feature = "smtp")]
fn a_value_that_selects_a_variant_is_refused_naming_the_allowed_ones() {
    let smtp = |tls: &str| {
        format!(
            "[store]\nurl = \"sqlite://x.db\"\n[[consumers]]\nname = \"email\"\nsource = \"http\"\non_unknown = \"park\"\n[consumers.effect]\nkind = \"smtp\"\nhost = \"127.0.0.1\"\n{tls}\n"
        )
    };
    for tls in ["none", "starttls", "tls"] {
        let l = load(&smtp(&format!("tls = \"{tls}\"")), &[]).unwrap();
        let EffectConfig::Smtp(s) = &l.config.consumers[0].effect else {
            panic!("smtp effect")
        };
        assert_eq!(toml::Value::try_from(s.tls).unwrap().as_str(), Some(tls));
    }
    let l = load(&smtp(""), &[]).unwrap();
    let EffectConfig::Smtp(s) = &l.config.consumers[0].effect else {
        panic!("smtp effect")
    };
    assert_eq!(s.tls, SmtpTls::None, "the default");
    let e = error_of(&smtp("tls = \"ssl\""));
    for needle in ["consumers[0].effect", "tls = \"ssl\"", "none", "starttls"] {
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
    let e = error_of(&BASE.replace("source = \"http\"", "source = \"kafka\""));
    for needle in ["consumers[0].source", "kafka", "http", "amqp"] {
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
}

#[test]
#[cfg(feature = "amqp")]
fn amqp_keys_belong_to_amqp_consumers() {
    let l = load(
        &BASE.replace(
            "source = \"http\"",
            "source = \"amqp\"\namqp_url = \"amqp://x\"\nqueue = \"q\"\ndead_letter_exchange = \"q.dlx\"",
        ),
        &[],
    )
    .unwrap();
    let a = l.config.consumers[0].amqp().expect("amqp settings");
    assert_eq!((a.queue.as_str(), a.prefetch, a.declare), ("q", 64, true));
    assert!(a.message_id_header.is_empty());
    for key in [
        "queue = \"q\"",
        "prefetch = 8",
        "message_id_header = \"x-id\"",
    ] {
        let e = error_of(&BASE.replace("source = \"http\"", &format!("source = \"http\"\n{key}")));
        let name = key.split(' ').next().unwrap();
        assert!(
            e.contains("consumers[0]") && e.contains(name) && e.contains("source = \"amqp\""),
            "{e}"
        );
    }
}

#[test]
fn request_shaping_is_checked_at_load_naming_the_key() {
    let with = |effect_lines: &str| {
        let text = BASE.replace(
            "timeout = \"10s\"",
            &format!("timeout = \"10s\"\n{effect_lines}"),
        );
        load(&text, &[]).map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(with("body = \"form\"\nbody_template = { amount = \"{amount}\", metadata = { k = \"{key}\" } }").is_ok());
    for (lines, key, why) in [
        ("body = \"json\"", "effect.body_template", "is required"),
        (
            "body_template = { a = \"b\" }",
            "effect.body_template",
            "only used",
        ),
        (
            "body = \"json\"\nbody_template = { a = \"{unclosed\" }",
            "effect.body_template",
            "closing",
        ),
        (
            "idempotency_header = \"\"",
            "effect.idempotency_header",
            "never see the key",
        ),
        (
            "status_url = \"http://p/v1/search?ref={message_id}\"",
            "effect.status_url",
            "{key}",
        ),
        (
            "status_url = \"http://p/v1/{customer id}/{key}\"",
            "effect.status_url",
            "not a field name",
        ),
        (
            "status = { found_pointer = \"data/0\" }",
            "effect.status.found_pointer",
            "JSON pointer",
        ),
    ] {
        let e = with(lines).unwrap_err();
        assert!(
            e.contains(&format!("consumers[0].{key}")) && e.contains(why),
            "{lines}: {e}"
        );
    }
    // The key in the body is enough without a header.
    assert!(with("idempotency_header = \"\"\nbody = \"json\"\nbody_template = { idempotency_key = \"{key}\" }").is_ok());
}

#[test]
fn max_sends_defaults_to_three_and_must_allow_the_first_send() {
    let l = load(BASE, &[]).unwrap();
    assert_eq!(l.config.consumers[0].max_sends, 3);
    let e = load(
        &BASE.replace("lease = \"60s\"", "lease = \"60s\"\nmax_sends = 0"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("consumers[0].max_sends"), "{e}");
}

#[test]
fn an_error_in_an_environment_override_names_the_variable_not_the_file() {
    let e = load(BASE, &[("CLAIMD__HTTP__MAX_BODY_BYTES", "lots")])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("environment CLAIMD__HTTP__MAX_BODY_BYTES: http.max_body_bytes:"),
        "{e}"
    );
    let e = load(BASE, &[("CLAIMD__CONSUMERS__0__LEASE", "soon")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("environment CLAIMD__CONSUMERS__0__LEASE"), "{e}");
    // An entry of a list that the file does not have cannot be made up.
    let e = load(BASE, &[("CLAIMD__CONSUMERS__3__LEASE", "90s")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("CLAIMD__CONSUMERS__3__LEASE"), "{e}");
    let bare = "[store]\nurl = \"sqlite://x.db\"\n";
    let e = load(bare, &[("CLAIMD__CONSUMERS__0__LEASE", "90s")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("there is no consumers[0] in the file"), "{e}");
    // Errors in what the file says still name the file.
    let e = error_of(&BASE.replace("lease = \"60s\"", "lease = \"soon\""));
    assert!(e.starts_with("c.toml: consumers[0].lease"), "{e}");
}

#[test]
fn an_error_inside_the_effect_names_the_field() {
    let e = error_of(&BASE.replace("timeout = \"10s\"", "timeout = \"zz\""));
    assert!(
        e.contains("consumers[0].effect: timeout: invalid duration"),
        "{e}"
    );
    let e = error_of(&BASE.replace("timeout = \"10s\"", "timeout = \"10s\"\ntimeuot = \"1s\""));
    assert!(
        e.contains("consumers[0].effect") && e.contains("timeuot"),
        "{e}"
    );
    let e = error_of(&BASE.replace("kind = \"http\"", "kind = \"kafka\""));
    assert!(
        e.contains("kafka") && e.contains("http") && e.contains("smtp"),
        "{e}"
    );
}

#[test]
fn log_format_is_read_and_unknown_values_are_refused_by_key() {
    let l = load(BASE, &[]).unwrap();
    assert_eq!(l.config.log.format, LogFormat::Auto);
    assert_eq!(LogFormat::Auto.resolve(true), LogFormat::Pretty);
    assert_eq!(LogFormat::Auto.resolve(false), LogFormat::Json);
    let text = format!("[log]\nformat = \"pretty\"\n{BASE}");
    assert_eq!(
        load(&text, &[]).unwrap().config.log.format,
        LogFormat::Pretty
    );
    assert_eq!(LogFormat::Pretty.resolve(false), LogFormat::Pretty);
    let env = [("CLAIMD__LOG__FORMAT", "json")];
    assert_eq!(
        load(&text, &env).unwrap().config.log.format,
        LogFormat::Json
    );
    let e = load(&format!("[log]\nformat = \"loud\"\n{BASE}"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("c.toml: log.format:") && e.contains("pretty"),
        "{e}"
    );
}

#[test]
fn the_http_version_is_1_1_unless_2_is_asked_and_nothing_else_is_taken() {
    let version = |text: &str| {
        let l = load(text, &[]).unwrap();
        let EffectConfig::Http(h) = &l.config.consumers[0].effect else {
            panic!("http effect")
        };
        h.http_version
    };
    assert_eq!(version(BASE), HttpVersion::Http1);
    let with = |v: &str| {
        BASE.replace(
            "timeout = \"10s\"",
            &format!("timeout = \"10s\"\nhttp_version = {v}"),
        )
    };
    assert_eq!(version(&with("\"1.1\"")), HttpVersion::Http1);
    assert_eq!(version(&with("\"2\"")), HttpVersion::Http2);
    assert_eq!(version(&with("2")), HttpVersion::Http2);
    assert_eq!(version(&with("1.1")), HttpVersion::Http1);
    for bad in ["\"3\"", "3", "\"h2c\"", "1.0"] {
        let e = error_of(&with(bad));
        for needle in ["consumers[0].effect", "http_version", "1.1"] {
            assert!(e.contains(needle), "{bad}: {needle:?} not in {e:?}");
        }
    }
}

/// Issue 24: a TOML syntax error says where (line, column, key), never the line's text.
#[test]
fn a_syntax_error_names_line_column_and_key_but_not_the_text() {
    let text = "[store]\nurl = \"sqlite://x.db\"\n[http]\nadmin_token = \"SuperSecretValue1234\n";
    let e = error_of(text);
    assert!(!e.contains("SuperSecret"), "the line is not shown: {e}");
    assert!(
        e.contains("not valid TOML")
            && e.contains("line 4, column")
            && e.contains("key http.admin_token"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e:?}");
    // A line that is no `key = value` gives no key (and still no text).
    let e = error_of("[store]\nurl = \"\"\"\nsecret=hunter2 \" \" \" \n");
    assert!(!e.contains("hunter2") && e.contains("line "), "{e}");
}

/// Issue 24: `--config` reads a regular file of at most 1 MiB: no device, no pipe, no endless
/// read; a file that is not TOML (`/proc/self/environ`) is refused without its content.
#[test]
fn only_a_regular_file_of_bounded_size_is_read_and_none_of_its_text_is_echoed() {
    for device in ["/dev/zero", "/dev/null", "/"] {
        let e = Config::load(Path::new(device)).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{device}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "#".repeat(MAX_CONFIG_BYTES as usize + 1)).unwrap();
    let e = Config::load(&big).unwrap_err().to_string();
    assert!(e.contains("larger than 1048576 bytes"), "{e}");
    let environ = dir.path().join("environ");
    std::fs::write(&environ, b"HOME=/root\0CLAIMD_SECRET=hunter2\0PATH=/bin\0").unwrap();
    let e = Config::load(&environ).unwrap_err().to_string();
    assert!(!e.contains("hunter2") && !e.contains("HOME"), "{e}");
    if Path::new("/proc/self/environ").exists() {
        let e = Config::load(Path::new("/proc/self/environ"))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("PATH=") && !e.contains("HOME="), "{e}");
    }
}

/// Issue 24: tokens are empty or at least 16 characters, and the admin token is not the
/// intake token; the message names the key and never the value.
#[test]
fn short_or_shared_tokens_are_refused_naming_the_key() {
    let with = |http: &str| BASE.replace("[store]", &format!("[http]\n{http}\n[store]"));
    let env = [("PROVIDER_TOKEN", "x")];
    for (http, key) in [
        ("admin_token = \"adm1n\"", "http.admin_token"),
        ("intake_token = \"short-token-15c\"", "http.intake_token"),
        (
            "admin_token = \"same-token-0123456789\"\nintake_token = \"same-token-0123456789\"",
            "http.intake_token",
        ),
    ] {
        let e = load(&with(http), &env).unwrap_err().to_string();
        assert!(e.contains(key), "{http}: {e}");
        assert!(
            !e.contains("adm1n") && !e.contains("short-token") && !e.contains("same-token"),
            "no token shown: {e}"
        );
    }
    for ok in [
        "admin_token = \"\"\nintake_token = \"\"",
        "admin_token = \"0123456789abcdef\"",
        "admin_token = \"admin-token-0123456789\"\nintake_token = \"intake-token-0123456789\"",
    ] {
        load(&with(ok), &env).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

/// Issue 24: a payload field in `effect.url`, as docs/providers.md allows, loads; an effect
/// URL in an error shows no query value that is not a known setting.
#[test]
fn a_payload_field_in_the_effect_url_loads_and_url_errors_hide_query_values() {
    let env = [("PROVIDER_TOKEN", "x")];
    let field = BASE.replace(
        "/v1/payments\"",
        "/v1/customers/{customer_id}/payments?ref={message_id}\"",
    );
    let l = load(&field, &env).unwrap_or_else(|e| panic!("{e}"));
    let EffectConfig::Http(h) = &l.config.consumers[0].effect else {
        panic!("http effect")
    };
    let effect = crate::provider::effect::http::HttpEffect::new(h).unwrap();
    use crate::provider::effect::Effect as _;
    assert!(
        effect
            .validate(br#"{"customer_id":"cus_1"}"#, "application/json")
            .is_ok()
    );
    let e = effect
        .validate(
            br#"{"customer_id":"cus_1","customer_id":"cus_2"}"#,
            "application/json",
        )
        .unwrap_err();
    assert!(e.contains("\"customer_id\" appears twice"), "{e}");
    let bad = BASE.replace(
        "url = \"http://127.0.0.1:8090/v1/payments\"",
        "url = \"http//127.0.0.1:8090/v1/payments?sig=hunter2&api-key=hunter2\"",
    );
    let e = load(&bad, &env).unwrap_err().to_string();
    assert!(e.contains("consumers[0].effect.url"), "{e}");
    assert!(!e.contains("hunter2") && e.contains("sig=***"), "{e}");
}

#[test]
fn a_setting_whose_part_this_build_left_out_is_refused_naming_the_feature() {
    let text = "[store]\nurl = \"sqlite://x.db\"\n[[consumers]]\nname = \"a\"\nsource = \"amqp\"\namqp_url = \"amqp://x\"\nqueue = \"q.a\"\ndead_letter_exchange = \"dlx.a\"\nprefetch = 8\n[consumers.effect]\nkind = \"http\"\nurl = \"http://127.0.0.1:8090/v1/a\"\n";
    let loaded = Config::from_toml(text, std::path::Path::new("claimd.toml"), []);
    let built_in = cfg!(feature = "amqp");
    assert_eq!(
        loaded.is_ok(),
        built_in,
        "amqp source accepted: {}",
        loaded.is_ok()
    );
    if let Err(e) = loaded {
        let e = e.to_string();
        assert!(
            e.contains("consumers[0].source") && e.contains("`amqp`"),
            "{e}"
        );
    }
}

#[test]
fn nats_keys_belong_to_nats_consumers_and_are_checked() {
    let nats = |extra: &str| {
        BASE.replace(
            "source = \"http\"",
            &format!(
                "source = \"nats\"\nnats_url = \"nats://127.0.0.1:4222\"\nstream = \"PAYMENTS\"\nsubject = \"payments.in\"\ndead_letter_subject = \"payments.dead\"\n{extra}"
            ),
        )
    };
    if !cfg!(feature = "nats") {
        let e = error_of(&nats(""));
        assert!(
            e.contains("consumers[0].source") && e.contains("`nats`"),
            "{e}"
        );
        return;
    }
    let l = load(&nats(""), &[]).unwrap();
    let n = l.config.consumers[0].nats().expect("nats settings");
    assert_eq!(n.durable, "claimd-payments");
    assert_eq!(n.message_id_header, "Nats-Msg-Id");
    assert_eq!((n.max_deliver, n.prefetch, n.declare), (5, 64, true));
    assert!(l.config.consumers[0].amqp().is_none());
    for (extra, key, words) in [
        ("queue = \"q\"", "queue", "source = \"amqp\""),
        ("max_deliver = 0", "max_deliver", "at least 1"),
        ("prefetch = 0", "prefetch", "at least 1"),
        ("ack_wait = \"500ms\"", "ack_wait", "under 1s"),
        ("durable = \"a.b\"", "durable", "not allowed"),
        (
            "message_id_header = \"\"",
            "message_id_header",
            "must name a header",
        ),
    ] {
        let e = error_of(&nats(extra));
        assert!(e.contains(key) && e.contains(words), "{extra}: {e}");
    }
    let e = error_of(&nats("").replace("payments.dead", "payments.in"));
    assert!(
        e.contains("dead_letter_subject") && e.contains("come back"),
        "{e}"
    );
    let e = error_of(
        &nats("")
            .replace("payments.in", "payments.>")
            .replace("payments.dead", "payments.dead.x"),
    );
    assert!(e.contains("matched by subject"), "{e}");
    let e = error_of(&nats("").replace("nats://127.0.0.1:4222", "http://x"));
    assert!(e.contains("nats_url") && e.contains("nats://"), "{e}");
    let e = error_of(&BASE.replace("source = \"http\"", "source = \"http\"\nstream = \"S\""));
    assert!(
        e.contains("stream") && e.contains("source = \"nats\""),
        "{e}"
    );
}

#[test]
fn the_cloudevents_tenant_attribute_is_a_cloudevents_name_on_an_http_consumer() {
    let with = |v: &str| {
        BASE.replace(
            "source = \"http\"",
            &format!("source = \"http\"\ncloudevents_tenant = \"{v}\""),
        )
    };
    let l = load(&with("tenantid"), &[]).unwrap();
    assert_eq!(
        l.config.consumers[0].cloudevents_tenant.as_deref(),
        Some("tenantid")
    );
    for bad in ["", "Tenant", "tenant-id", "abcdefghijklmnopqrstu"] {
        let e = error_of(&with(bad));
        assert!(
            e.contains("cloudevents_tenant") && e.contains("lower-case"),
            "{bad}: {e}"
        );
    }
    let e = error_of(
        &with("tenantid").replace(
            "source = \"http\"",
            "source = \"amqp\"\namqp_url = \"amqp://x\"\nqueue = \"q\"\ndead_letter_exchange = \"q.dlx\"",
        ),
    );
    assert!(
        e.contains("cloudevents_tenant") && e.contains("source = \"http\""),
        "{e}"
    );
}

#[test]
#[cfg(feature = "otlp")]
fn traces_are_off_by_default_and_their_settings_are_checked() {
    let off = load(BASE, &[]).unwrap().config;
    assert!(!off.traces.is_on());
    assert_eq!(off.traces.service_name, "claimd");
    let on = load(
        &format!("{BASE}\n[traces]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\n"),
        &[],
    )
    .unwrap()
    .config;
    assert!(on.traces.is_on());
    for (section, needle) in [
        ("endpoint = \"localhost:4318\"", "traces.endpoint"),
        ("endpoint = \"grpc://collector:4317\"", "traces.endpoint"),
        ("endpoint = \"not a url\"", "traces.endpoint"),
        ("service_name = \" \"", "traces.service_name"),
        ("export_every = \"10ms\"", "traces.export_every"),
        ("export_every = \"2m\"", "traces.export_every"),
        ("endpoint = 1", "traces"),
        ("sample = 0.5", "sample"),
    ] {
        let e = error_of(&format!("{BASE}\n[traces]\n{section}\n"));
        assert!(e.contains(needle), "{section}: {needle:?} not in {e:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn require_synchronous_standby_defaults_off_takes_the_environment_and_needs_postgresql() {
    let l = load(BASE, &[]).unwrap();
    assert!(!l.config.store.require_synchronous_standby);
    let pg = BASE.replace("sqlite://x.db", "postgres://claimd@db/claimd");
    let l = load(
        &pg,
        &[("CLAIMD__STORE__REQUIRE_SYNCHRONOUS_STANDBY", "true")],
    )
    .unwrap();
    assert!(l.config.store.require_synchronous_standby);
    let e = load(
        BASE,
        &[("CLAIMD__STORE__REQUIRE_SYNCHRONOUS_STANDBY", "true")],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("store.require_synchronous_standby"), "{e}");
    assert!(e.contains("SQLite is a single file"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn pooler_defaults_to_none_takes_the_environment_and_needs_postgresql() {
    use crate::store::pooler::Pooler;
    let l = load(BASE, &[]).unwrap();
    assert_eq!(l.config.store.pooler, Pooler::None);
    let pg = BASE.replace("sqlite://x.db", "postgres://claimd@pgbouncer:6432/claimd");
    let l = load(&pg, &[("CLAIMD__STORE__POOLER", "transaction")]).unwrap();
    assert_eq!(l.config.store.pooler, Pooler::Transaction);
    let e = load(&pg, &[("CLAIMD__STORE__POOLER", "statement")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("pooler"), "{e}");
    let e = load(BASE, &[("CLAIMD__STORE__POOLER", "transaction")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("store.pooler"), "{e}");
}

#[test]
fn retention_windows_default_to_keep_terminal_for() {
    let text = BASE.replace("sqlite://x.db", "postgres://h/db")
        + "\n[retention]\nkeep_terminal_for = \"10d\"\nkeep_failed_for = \"400d\"\narchive_after = \"2d\"\n";
    let l = load(&text, &[]).unwrap();
    let w = l.config.retention.windows();
    let day = Duration::from_secs(86_400);
    assert_eq!(
        (w.completed, w.failed, w.dead_letters),
        (10 * day, 400 * day, 10 * day)
    );
    assert_eq!((w.records, w.archive_after), (10 * day, Some(2 * day)));
}
