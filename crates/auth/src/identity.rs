//! The verified caller of the public API, and the one rule for its strings.

/// Longest actor or tenant, in bytes.
const MAX_IDENTITY_BYTES: usize = 128;

/// Who a verified token says is calling: the actor (`sub`), their tenant and their roles.
///
/// Every string has passed [`is_valid_identity`]: 1 to 128 bytes of `[A-Za-z0-9._:@/+=-]`.
/// They go into ledger records, log lines and storage keys, so a control character, a
/// space or a quote is refused at the door rather than escaped everywhere downstream.
/// Values such as `../../etc` pass: consumers must never build a file path from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The acting principal: the token's `sub`.
    pub actor: String,
    /// The tenant the actor acts in: the configured tenant claim.
    pub tenant: String,
    /// The roles the token grants: the configured roles claim, empty when absent; at most
    /// 256, each held to the same rule as actor and tenant (a token with a role that is
    /// not is rejected whole, rather than silently granting fewer roles).
    pub roles: Vec<String>,
}

impl Identity {
    /// Whether the token granted `role` (exact, case-sensitive match).
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }
}

/// Whether `value` may be an actor, a tenant, a role or a caller name.
pub fn is_valid_identity(value: &str) -> bool {
    (1..=MAX_IDENTITY_BYTES).contains(&value.len())
        && value.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'.' | b'_' | b':' | b'@' | b'/' | b'+' | b'=' | b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_strings() {
        for good in [
            "alice",
            "a",
            "user@example.com",
            "../../etc",
            "t:1/x+y=z_-.",
            &"x".repeat(128),
        ] {
            assert!(is_valid_identity(good), "{good:?}");
        }
        for bad in [
            "",
            "a b",
            "a\"b",
            "a'b",
            "a\nb",
            "a\0b",
            "é",
            "a\\b",
            &"x".repeat(129),
        ] {
            assert!(!is_valid_identity(bad), "{bad:?}");
        }
    }

    #[test]
    fn has_role_is_exact() {
        let identity = Identity {
            actor: "a".into(),
            tenant: "t".into(),
            roles: vec!["approver".into()],
        };
        assert!(identity.has_role("approver"));
        assert!(!identity.has_role("Approver"));
        assert!(!identity.has_role("approve"));
    }
}
