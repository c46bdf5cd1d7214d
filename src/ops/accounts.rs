//! Operator accounts: adding one (with a generated credential, or one the person chose),
//! listing, disabling, changing a role, and checking a name and credential at sign-in.
//! Credentials are kept only as hashes ([`credential`]); checking one costs a PBKDF2
//! derivation, run off the async threads.

use crate::domain::credential::{self, CredentialError};
use crate::domain::operator_role::{Identity, Role, valid_name};
use crate::store::audit::OperatorAccount;
use crate::store::{ClaimStore, StoreError};

/// Why an account change or a sign-in failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// The name is not 1-64 of letters, digits and `._@-` (or is `admin-token`).
    #[error(
        "the name {0:?} is not 1-64 letters, digits or ._@- (and `admin-token` is reserved for the admin token)"
    )]
    BadName(String),
    /// An account of that name exists (a disabled one keeps its name).
    #[error("an account named {0:?} exists already (a disabled account keeps its name)")]
    Exists(String),
    /// No such account (or, for disabling, none active).
    #[error("no active account named {0:?}")]
    NoSuch(String),
    /// The credential is refused.
    #[error(transparent)]
    Credential(#[from] CredentialError),
    /// The store failed.
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
}

/// Why a sign-in was refused (the person is told only "wrong name or credential").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No account of that name.
    NoSuchAccount,
    /// The account is disabled.
    Disabled,
    /// The credential does not match.
    WrongCredential,
}

impl Refusal {
    /// The reason as the audit keeps it.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoSuchAccount => "no such account",
            Refusal::Disabled => "account disabled",
            Refusal::WrongCredential => "wrong credential",
        }
    }
}

fn check_name(name: &str) -> Result<(), AccountError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(AccountError::BadName(name.chars().take(70).collect()))
    }
}

/// Adds an account of `name` with `role`. With `chosen`, that credential (checked for shape);
/// without, a generated one. Returns the credential, to be shown once: only its hash is kept.
pub async fn add(
    store: &dyn ClaimStore,
    name: &str,
    role: Role,
    chosen: Option<String>,
) -> Result<String, AccountError> {
    check_name(name)?;
    let cred = match chosen {
        Some(c) => {
            credential::check_shape(&c)?;
            c
        }
        None => credential::generate()?,
    };
    let c = cred.clone();
    let hash = tokio::task::spawn_blocking(move || credential::hash(&c))
        .await
        .map_err(|_| CredentialError::Random)??;
    if !store.add_operator(name, role, &hash).await? {
        return Err(AccountError::Exists(name.to_string()));
    }
    Ok(cred)
}

/// Every account, by name.
pub async fn list(store: &dyn ClaimStore) -> Result<Vec<OperatorAccount>, AccountError> {
    Ok(store.operators().await?)
}

/// Disables the active account `name`: it signs in no more, and its sessions and credential
/// are refused from the next request on.
pub async fn disable(store: &dyn ClaimStore, name: &str) -> Result<(), AccountError> {
    if store.disable_operator(name).await? {
        Ok(())
    } else {
        Err(AccountError::NoSuch(name.chars().take(70).collect()))
    }
}

/// Gives the account `name` the role `role` (in effect from its next request).
pub async fn set_role(store: &dyn ClaimStore, name: &str, role: Role) -> Result<(), AccountError> {
    if store.set_operator_role(name, role).await? {
        Ok(())
    } else {
        Err(AccountError::NoSuch(name.chars().take(70).collect()))
    }
}

/// A hash of the same cost as a real one, checked when there is no account, so a wrong name
/// takes as long as a wrong credential (made once, of a throwaway value).
const DECOY_HASH: &str =
    "pbkdf2-sha256$600000$Kui5R3CA3mB0EbGucVVX2g$zG+ZJHj6MUOTqERZ71V+5iHWBnkI/6uWMzsKYvlFBPc";

/// Checks `name` and `credential`: the account's identity, or why it is refused.
pub async fn authenticate(
    store: &dyn ClaimStore,
    name: &str,
    credential: &str,
) -> Result<Result<Identity, Refusal>, StoreError> {
    let account = if valid_name(name) {
        store.operator(name).await?
    } else {
        None
    };
    let stored = account
        .as_ref()
        .map_or_else(|| DECOY_HASH.to_string(), |a| a.credential_hash.clone());
    let given = credential.to_string();
    let matches = tokio::task::spawn_blocking(move || credential::verify(&given, &stored))
        .await
        .unwrap_or(false);
    Ok(match account {
        None => Err(Refusal::NoSuchAccount),
        Some(_) if !matches => Err(Refusal::WrongCredential),
        Some(a) if !a.active() => Err(Refusal::Disabled),
        Some(a) => Ok(Identity::account(&a.name, a.role)),
    })
}

/// The identity of the active account `name` as it is now (its current role), or `None`
/// when it is disabled or gone: asked on every request a session or credential makes.
pub async fn current(store: &dyn ClaimStore, name: &str) -> Result<Option<Identity>, StoreError> {
    Ok(store
        .operator(name)
        .await?
        .filter(OperatorAccount::active)
        .map(|a| Identity::account(&a.name, a.role)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoy_is_a_real_hash_of_full_cost_that_nothing_short_matches() {
        assert!(DECOY_HASH.starts_with(&format!("pbkdf2-sha256${}$", credential::ITERATIONS)));
        assert!(!credential::verify("", DECOY_HASH));
        // Made by the same scheme (of a throwaway value; an unknown name is refused whatever
        // the credential).
        assert!(credential::verify(
            "decoy: no credential is this",
            DECOY_HASH
        ));
    }
}
