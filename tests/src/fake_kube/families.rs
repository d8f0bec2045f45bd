//! What the API server does with the IP families of a Service (KEP-563, GA in Kubernetes 1.23), in
//! a dual-stack cluster whose primary family is IPv4 (or IPv6: [`super::FakeApi::set_primary_family`]):
//!
//! - a Service with a cluster IP (not `ExternalName`, not headless) always gets
//!   `spec.ipFamilyPolicy` (default `SingleStack`; `RequireDualStack` when two families are given
//!   without a policy) and `spec.ipFamilies`: the cluster's primary family for `SingleStack`, both
//!   (the given one first) for the dual-stack policies;
//! - `SingleStack` on an update of a dual-stack Service keeps the first family only (the
//!   downgrade Kubernetes documents); a dual-stack policy on a single-stack one adds the other;
//! - refused (422, as the API server does): a family other than `IPv4`/`IPv6`, one listed twice, two
//!   families with `SingleStack` on create, and a change of `ipFamilies[0]` (immutable).

use serde_json::{Value, json};

/// Defaults and validates `new` (a Service being created when `old` is `None`, else updated).
pub(crate) fn admit_service(
    old: Option<&Value>,
    new: &mut Value,
    primary: &str,
) -> Result<(), String> {
    let spec = &new["spec"];
    let headless = spec["clusterIP"].as_str() == Some("None");
    if spec["type"].as_str() == Some("ExternalName") || headless {
        return Ok(());
    }
    let mut families: Vec<String> = match &spec["ipFamilies"] {
        Value::Null => Vec::new(),
        Value::Array(a) => a
            .iter()
            .map(|f| {
                f.as_str()
                    .map(str::to_owned)
                    .ok_or("spec.ipFamilies: must be strings")
            })
            .collect::<Result<_, _>>()?,
        _ => return Err("spec.ipFamilies: must be a list".into()),
    };
    for (i, f) in families.iter().enumerate() {
        if f != "IPv4" && f != "IPv6" {
            return Err(format!(
                "spec.ipFamilies[{i}]: Unsupported value: \"{f}\": supported values: \"IPv4\", \"IPv6\""
            ));
        }
        if families[..i].contains(f) {
            return Err(format!("spec.ipFamilies[{i}]: Duplicate value: \"{f}\""));
        }
    }
    if families.len() > 2 {
        return Err("spec.ipFamilies: Too many: may contain at most 2 items".into());
    }
    let policy = match spec["ipFamilyPolicy"].as_str() {
        Some(p @ ("SingleStack" | "PreferDualStack" | "RequireDualStack")) => p.to_owned(),
        Some(p) => {
            return Err(format!(
                "spec.ipFamilyPolicy: Unsupported value: \"{p}\": supported values: \
                 \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\""
            ));
        }
        None if families.len() == 2 => "RequireDualStack".to_owned(),
        None => "SingleStack".to_owned(),
    };
    let old_families: Vec<String> = old
        .and_then(|o| o["spec"]["ipFamilies"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if families.is_empty() {
        families = old_families.clone();
    }
    if families.is_empty() {
        families.push(primary.to_owned());
    }
    if let (Some(was), Some(now)) = (old_families.first(), families.first())
        && was != now
    {
        return Err("spec.ipFamilies[0]: Invalid value: field is immutable".into());
    }
    if policy == "SingleStack" {
        if families.len() == 2 && old.is_none() {
            return Err(
                "spec.ipFamilies: Invalid value: when spec.ipFamilyPolicy is SingleStack, at most 1 \
                 family may be given"
                    .into(),
            );
        }
        families.truncate(1);
    } else if families.len() == 1 {
        let other = if families[0] == "IPv4" {
            "IPv6"
        } else {
            "IPv4"
        };
        families.push(other.to_owned());
    }
    new["spec"]["ipFamilyPolicy"] = json!(policy);
    new["spec"]["ipFamilies"] = json!(families);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: Value) -> Value {
        json!({"metadata": {"name": "s"}, "spec": spec})
    }

    #[test]
    fn defaults_and_refusals_follow_the_api_server() {
        let mut s = svc(json!({"type": "LoadBalancer"}));
        admit_service(None, &mut s, "IPv4").unwrap();
        assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
        assert_eq!(s["spec"]["ipFamilyPolicy"], "SingleStack");

        let mut d = svc(json!({"type": "LoadBalancer", "ipFamilyPolicy": "PreferDualStack"}));
        admit_service(None, &mut d, "IPv4").unwrap();
        assert_eq!(d["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));

        let mut six = svc(json!({"ipFamilies": ["IPv6"], "ipFamilyPolicy": "RequireDualStack"}));
        admit_service(None, &mut six, "IPv4").unwrap();
        assert_eq!(six["spec"]["ipFamilies"], json!(["IPv6", "IPv4"]));

        // SingleStack → PreferDualStack on a live Service, and back.
        let mut up = s.clone();
        up["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
        admit_service(Some(&s), &mut up, "IPv4").unwrap();
        assert_eq!(up["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
        let mut down = up.clone();
        down["spec"]["ipFamilyPolicy"] = json!("SingleStack");
        admit_service(Some(&up), &mut down, "IPv4").unwrap();
        assert_eq!(down["spec"]["ipFamilies"], json!(["IPv4"]));

        let mut flip = s.clone();
        flip["spec"]["ipFamilies"] = json!(["IPv6"]);
        assert!(
            admit_service(Some(&s), &mut flip, "IPv4")
                .unwrap_err()
                .contains("immutable")
        );
        let mut bad = svc(json!({"ipFamilies": ["IPv5"]}));
        assert!(
            admit_service(None, &mut bad, "IPv4")
                .unwrap_err()
                .contains("Unsupported value")
        );
        let mut two = svc(json!({"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "SingleStack"}));
        assert!(admit_service(None, &mut two, "IPv4").is_err());
        let mut headless = svc(json!({"clusterIP": "None"}));
        admit_service(None, &mut headless, "IPv4").unwrap();
        assert!(headless["spec"].get("ipFamilies").is_none());
    }
}
