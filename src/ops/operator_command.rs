//! The `claimd` command lines claimd suggests to operators (on the operator page and in
//! `claimd reconcile`'s output), built in one place so that each one parses when pasted.
//!
//! Values come from clients (message ids, tenants) and may hold anything: each word is quoted
//! for a POSIX shell (single quotes), an id that starts with `-` is put after `--` (the options
//! then come first), and a value that starts with `-` is joined to its option with `=`. When the
//! worker read its configuration from a file, `--config <path>` names it; when its store URL
//! came from the environment (`CLAIMD__STORE__URL`, a `${VAR}` in `[store] url`), the command
//! starts with `NAME="${NAME:?...}"` for each such variable. So the command acts on the same
//! store, or (in a shell without the variable) refuses to run rather than open another.

use crate::domain::claim::ClaimState;
use crate::ops::operator_action::Action;
use std::path::Path;

/// Quotes a word for a POSIX shell (and zsh) so a pasted command passes it verbatim: plain
/// words stay as they are; anything else goes in single quotes (a `'` inside as `'\''`).
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+,".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `--name value`, or `--name=value` when the value starts with `-` (it would read as an
/// option of its own), the value quoted.
fn option(name: &str, value: &str) -> String {
    let sep = if value.starts_with('-') { "=" } else { " " };
    format!("{name}{sep}{}", shell_quote(value))
}

/// The claim a command is about.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRef<'a> {
    /// Consumer.
    pub consumer: &'a str,
    /// Tenant (empty: none).
    pub tenant: &'a str,
    /// Message id.
    pub message_id: &'a str,
}

/// Why a claim is resolved, for `--note`.
#[derive(Debug, Clone, Copy)]
pub enum Note<'a> {
    /// `"..."`, for the operator to replace with the reason (it parses as the note `...`).
    ToWrite,
    /// This text, quoted.
    Text(&'a str),
}

/// Builds the suggested commands for one worker's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorCommands {
    /// The configuration file the worker runs with, when it read one.
    config: Option<String>,
    /// The environment variables the worker's store URL came from (`CLAIMD__STORE__URL`, or
    /// a `${VAR}` in the file's `[store] url`): each command is prefixed with them.
    store_env: Vec<String>,
}

impl OperatorCommands {
    /// Commands for a worker whose configuration came from `config` (`None`: not from a file,
    /// so the commands name none and `claimd` reads its default).
    pub fn new(config: Option<&Path>) -> Self {
        OperatorCommands {
            config: config.map(|p| p.to_string_lossy().into_owned()),
            store_env: Vec::new(),
        }
    }

    /// Commands for a worker running `config`: its file, and the environment variables its
    /// store URL was read from ([`Config::store_url_from`](crate::config::Config)).
    pub fn for_config(config: &crate::config::Config) -> Self {
        OperatorCommands::new(config.file.as_deref()).with_store_env(&config.store_url_from)
    }

    /// These variables carried by every command: `NAME="${NAME:?...}"` before `claimd`. The
    /// shell passes the value the operator's shell has (never shown: a URL may hold a
    /// password) and refuses to run the command when it has none, where the file's own URL
    /// would name another store.
    pub fn with_store_env(mut self, names: &[String]) -> Self {
        // Only names a shell can expand; claimd's own are `CLAIMD__...` and `${VAR}` names.
        self.store_env = names
            .iter()
            .filter(|n| {
                !n.is_empty()
                    && !n.starts_with(|c: char| c.is_ascii_digit())
                    && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .cloned()
            .collect();
        self
    }

    /// The environment variables every command is prefixed with.
    pub fn store_env(&self) -> &[String] {
        &self.store_env
    }

    /// Whether the commands name a configuration file.
    pub fn names_config(&self) -> bool {
        self.config.is_some()
    }

    /// `claimd claims show ...`
    pub fn show(&self, claim: ClaimRef<'_>) -> String {
        self.claims("show", claim, vec![])
    }

    /// `claimd claims resolve ... --as <to> --note <note>`
    pub fn resolve(&self, claim: ClaimRef<'_>, to: ClaimState, note: Note<'_>) -> String {
        let note = match note {
            Note::ToWrite => "--note \"...\"".to_string(),
            Note::Text(t) => option("--note", t),
        };
        self.claims("resolve", claim, vec![option("--as", to.as_str()), note])
    }

    /// `claimd claims redrive ...`
    pub fn redrive(&self, claim: ClaimRef<'_>) -> String {
        self.claims("redrive", claim, vec![])
    }

    /// The bulk form: `claimd claims resolve|redrive --consumer C --reason-prefix R` (with
    /// `--as` and `--note` for a resolve), then `--yes` when `apply`.
    pub fn bulk(
        &self,
        action: Action,
        consumer: &str,
        reason_prefix: &str,
        note: &str,
        apply: bool,
    ) -> String {
        let mut options = vec![option("--consumer", consumer)];
        if !reason_prefix.is_empty() {
            options.push(option("--reason-prefix", reason_prefix));
        }
        let sub = match action {
            Action::Redrive => {
                if !note.is_empty() {
                    options.push(option("--note", note));
                }
                "redrive"
            }
            Action::Complete | Action::Fail => {
                let to = if action == Action::Complete {
                    ClaimState::Completed
                } else {
                    ClaimState::Failed
                };
                options.push(option("--as", to.as_str()));
                options.push(option("--note", note));
                "resolve"
            }
        };
        let mut cmd = self.with_options(format!("claimd claims {sub}"), options);
        if apply {
            cmd.push_str(" --yes");
        }
        cmd
    }

    /// `claimd sweep`
    pub fn sweep(&self) -> String {
        self.with_options("claimd sweep".into(), vec![])
    }

    /// `claimd report --format json`, on the worker's store.
    pub fn report_json(&self) -> String {
        self.with_options(
            "claimd report".into(),
            vec!["--format".into(), "json".into()],
        )
    }

    /// `claimd claims list` with these options (plain words from claimd, not quoted).
    pub fn list(&self, options: &[&str]) -> String {
        let options = options.iter().map(|o| o.to_string()).collect();
        self.with_options("claimd claims list".into(), options)
    }

    /// `cmd` with `options` and `--config`, after the store's environment variables.
    fn with_options(&self, cmd: String, mut options: Vec<String>) -> String {
        if let Some(path) = &self.config {
            options.push(option("--config", path));
        }
        let mut line = String::new();
        for name in &self.store_env {
            line.push_str(&format!(
                "{name}=\"${{{name}:?set it as the worker has it}}\" "
            ));
        }
        line.push_str(&cmd);
        for o in options {
            line.push(' ');
            line.push_str(&o);
        }
        line
    }

    /// `claimd claims SUB CONSUMER MESSAGE_ID [OPTIONS]`, or, when an id starts with `-`,
    /// `claimd claims SUB [OPTIONS] -- CONSUMER MESSAGE_ID`.
    fn claims(&self, sub: &str, claim: ClaimRef<'_>, mut options: Vec<String>) -> String {
        if !claim.tenant.is_empty() {
            options.push(option("--tenant", claim.tenant));
        }
        let positional = format!(
            "{} {}",
            shell_quote(claim.consumer),
            shell_quote(claim.message_id)
        );
        if claim.consumer.starts_with('-') || claim.message_id.starts_with('-') {
            let cmd = self.with_options(format!("claimd claims {sub}"), options);
            format!("{cmd} -- {positional}")
        } else {
            self.with_options(format!("claimd claims {sub} {positional}"), options)
        }
    }
}

#[cfg(all(test, feature = "cli"))]
mod tests {
    use super::*;
    use crate::cli::{ClaimsCommand, Cli, Command};
    use clap::Parser;

    /// Splits a command line the way a POSIX shell does for the quoting claimd writes
    /// (single quotes, `'\''`, double quotes without expansions, spaces).
    fn shell_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word: Option<String> = None;
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                ' ' => words.extend(word.take()),
                '\'' => {
                    let w = word.get_or_insert_with(String::new);
                    for c in chars.by_ref().take_while(|c| *c != '\'') {
                        w.push(c);
                    }
                }
                '"' => {
                    let w = word.get_or_insert_with(String::new);
                    for c in chars.by_ref().take_while(|c| *c != '"') {
                        assert!(!"$`\\".contains(c), "expansion in double quotes: {line}");
                        w.push(c);
                    }
                }
                '\\' => word
                    .get_or_insert_with(String::new)
                    .push(chars.next().expect("escaped character")),
                c => {
                    assert!(!"$`;&|<>()*?[]#~".contains(c), "unquoted {c:?} in {line}");
                    word.get_or_insert_with(String::new).push(c);
                }
            }
        }
        words.extend(word);
        words
    }

    fn parse(line: &str) -> Cli {
        Cli::try_parse_from(shell_words(line)).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    const HOSTILE: [&str; 10] = [
        "order-1",
        "-x",
        "--tenant",
        "--",
        "a b",
        "it's",
        "$(rm -rf ~)",
        "`id`;echo \"x\"",
        "-",
        "--config=/etc/passwd",
    ];

    #[test]
    fn every_suggested_command_parses_back_to_the_same_claim() {
        for config in [None, Some(Path::new("/etc/claimd/it's here.toml"))] {
            let commands = OperatorCommands::new(config);
            for consumer in ["payments", "-p"] {
                for tenant in ["", "acme", "-t", "a b"] {
                    for id in HOSTILE {
                        let claim = ClaimRef {
                            consumer,
                            tenant,
                            message_id: id,
                        };
                        let expect_config = config.unwrap_or(Path::new("config/default.toml"));
                        let cli = parse(&commands.redrive(claim));
                        assert_eq!(cli.config_path(), expect_config);
                        match cli.command {
                            Command::Claims {
                                command:
                                    ClaimsCommand::Redrive {
                                        consumer: Some(c),
                                        message_id: Some(m),
                                        tenant: t,
                                        ..
                                    },
                            } => assert_eq!(
                                (c.as_str(), t.as_str(), m.as_str()),
                                (consumer, tenant, id)
                            ),
                            other => panic!("{other:?}"),
                        }
                        let line = commands.resolve(claim, ClaimState::Completed, Note::Text(id));
                        match parse(&line).command {
                            Command::Claims {
                                command:
                                    ClaimsCommand::Resolve {
                                        consumer: Some(c),
                                        message_id: Some(m),
                                        to,
                                        note,
                                        tenant: t,
                                        ..
                                    },
                            } => {
                                assert_eq!(
                                    (c.as_str(), t.as_str(), m.as_str()),
                                    (consumer, tenant, id)
                                );
                                assert_eq!((to, note.as_str()), (ClaimState::Completed, id));
                            }
                            other => panic!("{line}: {other:?}"),
                        }
                        let line = commands.resolve(claim, ClaimState::Failed, Note::ToWrite);
                        assert!(
                            matches!(
                                parse(&line).command,
                                Command::Claims { command: ClaimsCommand::Resolve { note, to: ClaimState::Failed, .. } } if note == "..."
                            ),
                            "{line}"
                        );
                        let line = commands.show(claim);
                        assert!(
                            matches!(
                                parse(&line).command,
                                Command::Claims { command: ClaimsCommand::Show { message_id, .. } } if message_id == id
                            ),
                            "{line}"
                        );
                    }
                }
            }
            assert!(matches!(
                parse(&commands.sweep()).command,
                Command::Sweep { dry_run: false }
            ));
            assert!(matches!(
                parse(&commands.list(&["--stuck"])).command,
                Command::Claims {
                    command: ClaimsCommand::List { stuck: true, .. }
                }
            ));
        }
    }

    #[test]
    fn bulk_commands_parse_back_to_the_same_selection() {
        let commands = OperatorCommands::new(Some(Path::new("/etc/claimd/it's here.toml")));
        for reason in HOSTILE.into_iter().chain([""]) {
            for (action, apply) in [(Action::Redrive, false), (Action::Fail, true)] {
                let line = commands.bulk(action, "-p", reason, reason, apply);
                let (bulk, note) = match parse(&line).command {
                    Command::Claims {
                        command:
                            ClaimsCommand::Redrive {
                                bulk,
                                consumer: None,
                                ..
                            },
                    } => (bulk, String::new()),
                    Command::Claims {
                        command:
                            ClaimsCommand::Resolve {
                                bulk,
                                note,
                                to: ClaimState::Failed,
                                consumer: None,
                                ..
                            },
                    } => (bulk, note),
                    other => panic!("{line}: {other:?}"),
                };
                assert_eq!(bulk.consumer.as_deref(), Some("-p"), "{line}");
                assert_eq!(bulk.reason_prefix.unwrap_or_default(), reason, "{line}");
                assert_eq!(bulk.yes, apply, "{line}");
                if action != Action::Redrive {
                    assert_eq!(note, reason, "{line}");
                }
            }
        }
    }

    #[test]
    fn plain_commands_read_plainly() {
        let c = OperatorCommands::default();
        let claim = ClaimRef {
            consumer: "payments",
            tenant: "acme",
            message_id: "order-1",
        };
        assert_eq!(
            c.redrive(claim),
            "claimd claims redrive payments order-1 --tenant acme"
        );
        assert_eq!(
            c.resolve(claim, ClaimState::Completed, Note::ToWrite),
            "claimd claims resolve payments order-1 --as completed --note \"...\" --tenant acme"
        );
        assert_eq!(c.sweep(), "claimd sweep");
        let c = OperatorCommands::new(Some(Path::new("/etc/claimd.toml")));
        assert_eq!(
            c.redrive(ClaimRef {
                tenant: "",
                ..claim
            }),
            "claimd claims redrive payments order-1 --config /etc/claimd.toml"
        );
        assert_eq!(
            c.redrive(ClaimRef {
                message_id: "-x",
                ..claim
            }),
            "claimd claims redrive --tenant acme --config /etc/claimd.toml -- payments -x"
        );
        assert_eq!(c.sweep(), "claimd sweep --config /etc/claimd.toml");
        assert_eq!(
            c.resolve(claim, ClaimState::Completed, Note::Text("paid (reconcile)")),
            "claimd claims resolve payments order-1 --as completed --note 'paid (reconcile)' \
             --tenant acme --config /etc/claimd.toml"
        );
    }

    #[test]
    fn commands_carry_the_variables_the_store_url_came_from() {
        let c = OperatorCommands::new(Some(Path::new("/etc/claimd.toml")))
            .with_store_env(&["CLAIMD__STORE__URL".to_string(), "not a name".to_string()]);
        let claim = ClaimRef {
            consumer: "payments",
            tenant: "",
            message_id: "-x",
        };
        let prefix = "CLAIMD__STORE__URL=\"${CLAIMD__STORE__URL:?set it as the worker has it}\" ";
        for line in [
            c.redrive(claim),
            c.sweep(),
            c.show(claim),
            c.bulk(Action::Redrive, "payments", "", "why", true),
        ] {
            let rest = line
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("{line}"));
            // What follows the assignment is the same command, parsing as before.
            let cli = parse(rest);
            assert_eq!(cli.config_path(), Path::new("/etc/claimd.toml"), "{line}");
        }
        assert!(matches!(
            parse(c.bulk(Action::Redrive, "payments", "", "why", true).strip_prefix(prefix).unwrap()).command,
            Command::Claims { command: ClaimsCommand::Redrive { note, .. } } if note == "why"
        ));
    }

    #[test]
    fn words_are_quoted_for_a_shell() {
        assert_eq!(shell_quote("order-1:a/b@c.d"), "order-1:a/b@c.d");
        assert_eq!(shell_quote("$(rm -rf ~)"), "'$(rm -rf ~)'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("a;b"), "'a;b'");
        assert_eq!(shell_quote(""), "''");
    }
}
