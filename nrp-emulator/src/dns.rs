//! Public IPs' DNS labels (`dnsSettings.domainNameLabel`): Azure's label expression, the name it
//! publishes (`{label}.{region}.cloudapp.azure.com`), and one label per region.

use crate::error::EmulatorError;
use crate::state::{NrpState, key_of};
use clb_nrp::wire::ResourceId;

/// Whether `label` is a DNS label Azure takes for a public IP (`dnsSettings.domainNameLabel`):
/// `^[a-z][a-z0-9-]{1,61}[a-z0-9]$`, so 3 to 63 characters.
pub(crate) fn is_domain_name_label(label: &str) -> bool {
    let b = label.as_bytes();
    (3..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The region as a DNS name has it: lower case, no spaces (`East US` is `eastus`).
fn dns_region(location: &str) -> String {
    location
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase()
}

/// The name Azure publishes for a public IP's DNS label in `location`.
pub(crate) fn fqdn(label: &str, location: &str) -> String {
    format!("{label}.{}.cloudapp.azure.com", dns_region(location))
}

impl NrpState {
    /// Checks the DNS label `label` of public IP `id` in `loc`: Azure's expression
    /// (`InvalidDomainNameLabel`), and no other public IP of the region with it (`DnsRecordInUse`).
    pub(crate) fn check_dns_label(
        &self,
        id: &ResourceId,
        loc: &str,
        label: &str,
    ) -> Result<(), EmulatorError> {
        if !is_domain_name_label(label) {
            return Err(EmulatorError::bad_request(
                "InvalidDomainNameLabel",
                format!(
                    "The domain name label {label} is invalid. It must conform to the \
                     following regular expression: ^[a-z][a-z0-9-]{{1,61}}[a-z0-9]$."
                ),
            ));
        }
        let key = key_of(id);
        let region = dns_region(loc);
        let taken = self.public_ips.iter().any(|(k, p)| {
            *k != key
                && p.properties.domain_name_label() == Some(label)
                && p.location.as_deref().map(dns_region).as_deref() == Some(region.as_str())
        });
        if taken {
            return Err(EmulatorError::bad_request(
                "DnsRecordInUse",
                format!(
                    "DNS record {} is already used by another public IP.",
                    fqdn(label, loc)
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_follow_azure_s_expression() {
        for ok in ["abc", "shop-1", "a1b", &format!("a{}", "b".repeat(62))] {
            assert!(is_domain_name_label(ok), "{ok}");
        }
        for bad in [
            "ab",
            "1abc",
            "-abc",
            "abc-",
            "Abc",
            "a_bc",
            "a.bc",
            "",
            &format!("a{}", "b".repeat(63)),
        ] {
            assert!(!is_domain_name_label(bad), "{bad}");
        }
        assert_eq!(fqdn("shop", "East US"), "shop.eastus.cloudapp.azure.com");
    }
}
