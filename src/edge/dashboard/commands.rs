//! What the operator page suggests running about a claim of the attention list, in the order
//! to try them; the command lines themselves come from [`OperatorCommands`].

use crate::domain::claim::ClaimState;
use crate::ops::operator_command::{ClaimRef, Note, OperatorCommands};
use crate::ops::report::AttentionItem;

/// What an operator can do about one claim of the attention list: (when, command), in the
/// order to try them. Plain text; the page escapes it.
pub fn commands_for(
    commands: &OperatorCommands,
    item: &AttentionItem,
) -> Vec<(&'static str, String)> {
    let claim = ClaimRef {
        consumer: &item.consumer,
        tenant: &item.tenant,
        message_id: &item.message_id,
    };
    let stuck = item.state == ClaimState::Started.as_str();
    commands_for_claim(commands, claim, if stuck { "stuck" } else { &item.state })
}

/// What an operator can do about a claim in `state` (a state's name, or `stuck`): (when,
/// command), in the order to try them. A claim in flight, pending or completed gets only
/// `show`.
pub fn commands_for_claim(
    commands: &OperatorCommands,
    claim: ClaimRef<'_>,
    state: &str,
) -> Vec<(&'static str, String)> {
    let show = ("look first", commands.show(claim));
    match state {
        "stuck" => vec![show, ("run a sweeper pass now", commands.sweep())],
        "needs_attention" => vec![
            show,
            (
                "the provider has the effect",
                commands.resolve(claim, ClaimState::Completed, Note::ToWrite),
            ),
            ("the provider has no record of it", commands.redrive(claim)),
        ],
        "failed" => vec![
            show,
            (
                "the provider has the effect after all",
                commands.resolve(claim, ClaimState::Completed, Note::ToWrite),
            ),
            ("fixed the cause: send it again", commands.redrive(claim)),
        ],
        _ => vec![show],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::dashboard::tests::item;

    #[test]
    fn parked_claims_get_resolve_and_redrive_commands_with_their_tenant() {
        let a = item("needs_attention", "payments", "", "order-1", "r");
        let cmds: Vec<String> = commands_for(&OperatorCommands::default(), &a)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        assert_eq!(
            cmds,
            [
                "claimd claims show payments order-1",
                "claimd claims resolve payments order-1 --as completed --note \"...\"",
                "claimd claims redrive payments order-1",
            ]
        );
        let a = item("needs_attention", "payments", "acme", "order-1", "r");
        let cmds: Vec<String> = commands_for(&OperatorCommands::default(), &a)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        assert_eq!(
            cmds[1],
            "claimd claims resolve payments order-1 --as completed --note \"...\" --tenant acme"
        );
        assert_eq!(
            cmds[2],
            "claimd claims redrive payments order-1 --tenant acme"
        );
    }

    #[test]
    fn failed_claims_get_resolve_and_redrive_commands() {
        let claim = ClaimRef {
            consumer: "payments",
            tenant: "",
            message_id: "order-9",
        };
        let cmds = commands_for_claim(&OperatorCommands::default(), claim, "failed");
        assert_eq!(cmds.len(), 3);
        assert_eq!(cmds[2].1, "claimd claims redrive payments order-9");
        assert_eq!(
            commands_for_claim(&OperatorCommands::default(), claim, "completed").len(),
            1
        );
    }

    #[test]
    fn stuck_claims_point_at_a_sweeper_pass() {
        let a = item("started", "payments", "t", "order-2", "lease expired");
        let cmds = commands_for(&OperatorCommands::default(), &a);
        assert_eq!(cmds.last().unwrap().1, "claimd sweep");
        assert_eq!(cmds[0].1, "claimd claims show payments order-2 --tenant t");
    }

    #[test]
    fn commands_quote_what_a_shell_would_read() {
        let a = item("needs_attention", "payments", "-t", "-x", "r");
        assert_eq!(
            commands_for(&OperatorCommands::default(), &a)[2].1,
            "claimd claims redrive --tenant=-t -- payments -x"
        );
        let a = item("needs_attention", "payments", "a b", "`id`", "r");
        assert_eq!(
            commands_for(&OperatorCommands::default(), &a)[2].1,
            "claimd claims redrive payments '`id`' --tenant 'a b'"
        );
    }
}
