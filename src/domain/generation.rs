//! Whether an instance's configuration of a consumer is the fleet's, during a rolling upgrade.
//! Each consumer has a `generation` (an operator raises it when a changed configuration must
//! not be performed by instances still running the old one) and an effect kind (`http`,
//! `smtp`, `sql`, `custom`). The database keeps the newest registered pair; an instance whose
//! pair is behind it takes no claim of that consumer. Pure.

/// One consumer's configuration, as far as an upgrade is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGeneration {
    /// The operator's `generation` of the consumer (default 0).
    pub generation: i64,
    /// The effect's kind.
    pub effect_kind: String,
}

/// How an instance's configuration of a consumer stands against the registered one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The same generation and effect kind, or a newer generation (this instance is the
    /// newest: it registers its own).
    Current,
    /// Another instance registered a newer generation: this one must stop taking claims.
    Behind {
        /// The registered generation.
        registered: i64,
        /// This instance's.
        here: i64,
    },
    /// The same generation with another effect kind: two configurations claim to be the
    /// same one. The first registered stands; the other must not take claims.
    KindConflict {
        /// The registered kind.
        registered: String,
        /// This instance's.
        here: String,
    },
}

/// Weighs this instance's configuration (`here`) against the registered one (`None`: not
/// registered yet, so `here` is the fleet's).
pub fn standing(here: &ConsumerGeneration, registered: Option<&ConsumerGeneration>) -> Standing {
    let Some(r) = registered else {
        return Standing::Current;
    };
    if r.generation > here.generation {
        return Standing::Behind {
            registered: r.generation,
            here: here.generation,
        };
    }
    // A registry row written by a build before effect kinds were recorded has none.
    if r.generation == here.generation
        && !r.effect_kind.is_empty()
        && r.effect_kind != here.effect_kind
    {
        return Standing::KindConflict {
            registered: r.effect_kind.clone(),
            here: here.effect_kind.clone(),
        };
    }
    Standing::Current
}

impl Standing {
    /// What a person reads when an instance stands down for `consumer`.
    pub fn sentence(&self, consumer: &str) -> Option<String> {
        match self {
            Standing::Current => None,
            Standing::Behind { registered, here } => Some(format!(
                "consumer {consumer}: another instance runs its configuration generation \
                 {registered}; this one has generation {here}: deploy the newer configuration \
                 here (this instance takes no claim of it meanwhile)"
            )),
            Standing::KindConflict { registered, here } => Some(format!(
                "consumer {consumer}: another instance registered effect kind {registered:?} at \
                 the same generation; this one has {here:?}: raise `generation` in the new \
                 configuration so instances can tell which is newer"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(generation: i64, kind: &str) -> ConsumerGeneration {
        ConsumerGeneration {
            generation,
            effect_kind: kind.into(),
        }
    }

    #[test]
    fn an_older_generation_or_another_kind_at_the_same_one_stands_down() {
        assert_eq!(standing(&g(0, "http"), None), Standing::Current);
        assert_eq!(
            standing(&g(1, "http"), Some(&g(1, "http"))),
            Standing::Current
        );
        assert_eq!(
            standing(&g(2, "sql"), Some(&g(1, "http"))),
            Standing::Current
        );
        assert_eq!(standing(&g(1, "http"), Some(&g(1, ""))), Standing::Current);
        let behind = standing(&g(1, "http"), Some(&g(2, "http")));
        assert_eq!(
            behind,
            Standing::Behind {
                registered: 2,
                here: 1
            }
        );
        assert!(
            behind
                .sentence("payments")
                .unwrap()
                .contains("generation 2")
        );
        let conflict = standing(&g(1, "http"), Some(&g(1, "sql")));
        assert!(matches!(conflict, Standing::KindConflict { .. }));
        assert!(
            conflict
                .sentence("payments")
                .unwrap()
                .contains("raise `generation`")
        );
        assert_eq!(Standing::Current.sentence("payments"), None);
    }
}
