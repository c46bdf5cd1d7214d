//! Which schemas a build may run on, for rolling upgrades: migrations are written
//! expand/contract. An **expand** migration only adds (a table, a column with a default, an
//! index, a function), so a build that does not know it still runs beside it. A **contract**
//! migration removes or changes what older builds read; its file name says so
//! (`NNNN_contract_<what>.sql`, its description starting with `contract`). A build refuses a
//! database that has a contract migration it does not know, naming the migration, and runs on
//! one that only has expand migrations it does not know (it applies nothing then).
//! Pure: the caller reads `_sqlx_migrations`.

/// What the applied migrations this build does not embed mean for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Window {
    /// Every applied migration is one this build embeds.
    Known,
    /// Newer migrations it does not know, all expand-only: it runs beside them.
    NewerExpand(Vec<i64>),
    /// A newer contract migration: this build must not run on this schema.
    TooNew {
        /// The contract migration's version.
        version: i64,
        /// Its description (from its file name).
        description: String,
    },
}

/// Whether a migration's description marks it as a contract (see the module).
pub fn is_contract(description: &str) -> bool {
    description
        .split([' ', '_'])
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("contract"))
}

/// Reads the applied migrations (`(version, description)`, successful ones) against the
/// versions this build embeds.
pub fn window(embedded: &[i64], applied: &[(i64, String)]) -> Window {
    let unknown: Vec<&(i64, String)> = applied
        .iter()
        .filter(|(v, _)| !embedded.contains(v))
        .collect();
    if let Some((version, description)) = unknown
        .iter()
        .filter(|(_, d)| is_contract(d))
        .min_by_key(|(v, _)| *v)
    {
        return Window::TooNew {
            version: *version,
            description: description.clone(),
        };
    }
    if unknown.is_empty() {
        Window::Known
    } else {
        Window::NewerExpand(unknown.iter().map(|(v, _)| *v).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_expand_migrations_are_run_beside_and_a_contract_one_is_refused() {
        let embedded = [1, 2, 3];
        let a = |v: i64, d: &str| (v, d.to_string());
        assert_eq!(
            window(&embedded, &[a(1, "claims"), a(2, "x")]),
            Window::Known
        );
        assert_eq!(
            window(
                &embedded,
                &[a(1, "claims"), a(4, "operators audit"), a(5, "erasure")]
            ),
            Window::NewerExpand(vec![4, 5])
        );
        assert_eq!(
            window(
                &embedded,
                &[a(4, "expand"), a(6, "contract drop x"), a(5, "contract y")]
            ),
            Window::TooNew {
                version: 5,
                description: "contract y".into()
            }
        );
        assert!(is_contract("Contract drop handoff"));
        assert!(!is_contract("contractor table"));
    }
}
