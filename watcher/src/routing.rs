//! Several gateways per cluster (`--gateways-file`): which gateways expose a Service, and which
//! gateway a node belongs to. Pure: no I/O.
//!
//! A LoadBalancer Service is exposed in the gateways its annotations select:
//! - [`NODEPOOL_SELECTOR_ANNOTATION`] (OpenYurt's): a label selector in the equality form
//!   `k=v,k2=v2` (`k==v` too), matched against each gateway's `labels` in the gateways file; set-based
//!   forms (`in`, `notin`, `!=`, `k`, `!k`) are refused;
//! - [`GATEWAYS_ANNOTATION`] (ours): gateway names, comma-separated;
//!
//! both together select the union; neither selects the default gateway only. A selection that
//! cannot be used is an error ([`SelectionError`]: field, quoted value, why) and changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use clb_gateways::{Gateways, Labels};

/// OpenYurt's annotation: the node pools (by their labels) a Service is exposed in.
pub const NODEPOOL_SELECTOR_ANNOTATION: &str = "service.openyurt.io/nodepool-labelselector";

/// Our annotation: the gateways (by name, comma-separated) a Service is exposed in.
pub const GATEWAYS_ANNOTATION: &str = "clb.azure.com/gateways";

/// Values in messages are cut to this many characters.
const MAX_QUOTED: usize = 100;

/// An annotation that cannot be used: what, the value, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionError {
    /// The field, e.g. `metadata.annotations["clb.azure.com/gateways"]`.
    pub field: String,
    /// The value, quoted and cut to 100 characters.
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

impl fmt::Display for SelectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = {}: {}; the Service's gateways are left as they were",
            self.field, self.value, self.reason
        )
    }
}

impl std::error::Error for SelectionError {}

/// A value quoted for a message, cut to 100 characters.
pub fn quote(value: &str) -> String {
    let mut cut: String = value.chars().take(MAX_QUOTED).collect();
    if cut.len() < value.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

fn error(annotation: &str, value: &str, reason: impl Into<String>) -> SelectionError {
    SelectionError {
        field: format!("metadata.annotations[{annotation:?}]"),
        value: quote(value),
        reason: reason.into(),
    }
}

/// Parses an equality-based label selector `k=v,k2=v2` (`k==v` too; spaces around terms allowed).
pub fn parse_selector(annotation: &str, text: &str) -> Result<Labels, SelectionError> {
    let mut out = BTreeMap::new();
    if text.trim().is_empty() {
        return Err(error(
            annotation,
            text,
            "is empty: give k=v terms, comma-separated",
        ));
    }
    for term in text.split(',') {
        let term = term.trim();
        let refused = |why: &str| error(annotation, text, format!("term {}: {why}", quote(term)));
        if term.contains("!=") {
            return Err(refused(
                "only the equality form k=v is supported (not k!=v)",
            ));
        }
        let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) else {
            return Err(refused(
                "only the equality form k=v is supported (not set-based forms: in, notin, k, !k)",
            ));
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            return Err(refused("the key is empty"));
        }
        let label_chars = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        };
        if !label_chars(k) || !label_chars(v) || v.contains('/') {
            return Err(refused(
                "keys and values may hold only letters, digits, '-', '_', '.' (and '/' in keys)",
            ));
        }
        if let Some(old) = out.insert(k.to_owned(), v.to_owned())
            && old != v
        {
            return Err(refused(&format!(
                "key {} is given twice with different values",
                quote(k)
            )));
        }
    }
    Ok(out)
}

/// The gateways (names as in the file) a Service with these annotations is exposed in.
pub fn selected(
    gateways: &Gateways,
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<BTreeSet<String>, SelectionError> {
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    let mut out = BTreeSet::new();
    let mut any = false;
    if let Some(text) = get(NODEPOOL_SELECTOR_ANNOTATION) {
        any = true;
        let selector = parse_selector(NODEPOOL_SELECTOR_ANNOTATION, text)?;
        let found = gateways.with_labels(&selector);
        if found.is_empty() {
            return Err(error(
                NODEPOOL_SELECTOR_ANNOTATION,
                text,
                "selects no gateway of the gateways file (no gateway's labels match)",
            ));
        }
        out.extend(found.into_iter().map(|g| g.name.clone()));
    }
    if let Some(text) = get(GATEWAYS_ANNOTATION) {
        any = true;
        let names: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Err(error(
                GATEWAYS_ANNOTATION,
                text,
                "names no gateway: give gateway names, comma-separated",
            ));
        }
        for n in names {
            let Some(g) = gateways.get(n) else {
                return Err(error(
                    GATEWAYS_ANNOTATION,
                    text,
                    format!(
                        "{} is not a gateway of the gateways file (known: {})",
                        quote(n),
                        gateways.names().join(", ")
                    ),
                ));
            };
            out.insert(g.name.clone());
        }
    }
    if !any {
        out.insert(gateways.default_gateway().name.clone());
    }
    Ok(out)
}

/// One gateway's share of the cluster: a translator scoped to it sends only the Services exposed
/// there, and endpoints and pods on its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayScope {
    /// The gateways file.
    pub gateways: Arc<Gateways>,
    /// This gateway's name (as in the file).
    pub name: String,
}

impl GatewayScope {
    /// Whether a node with these labels is served by this gateway.
    pub fn serves_node(&self, labels: &Labels) -> bool {
        self.gateways
            .gateway_of_node(labels)
            .is_some_and(|g| g.name == self.name)
    }

    /// Whether a Service with these annotations is exposed here (`Err`: the annotations cannot be
    /// used).
    pub fn exposes(
        &self,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Result<bool, SelectionError> {
        selected(&self.gateways, annotations).map(|s| s.contains(&self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gws() -> Gateways {
        Gateways::parse(
            r#"
gateways:
  - name: a
    labels: {region: east, tier: edge}
    nodes: {pool: pool-a}
    azure: {subscription: s, resourceGroup: rg, region: eastus}
  - name: b
    labels: {region: west, tier: edge}
    nodes: {pool: pool-b}
    azure: {subscription: s, resourceGroup: rg, region: westus}
"#,
        )
        .unwrap()
    }

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn names(s: &[&str]) -> BTreeSet<String> {
        s.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn default_selector_names_and_union() {
        let g = gws();
        assert_eq!(selected(&g, None).unwrap(), names(&["a"]));
        let a = ann(&[(NODEPOOL_SELECTOR_ANNOTATION, "tier=edge")]);
        assert_eq!(selected(&g, Some(&a)).unwrap(), names(&["a", "b"]));
        let a = ann(&[(NODEPOOL_SELECTOR_ANNOTATION, "region==west, tier=edge")]);
        assert_eq!(selected(&g, Some(&a)).unwrap(), names(&["b"]));
        let a = ann(&[(GATEWAYS_ANNOTATION, "B")]);
        assert_eq!(selected(&g, Some(&a)).unwrap(), names(&["b"]));
        let a = ann(&[
            (GATEWAYS_ANNOTATION, "b"),
            (NODEPOOL_SELECTOR_ANNOTATION, "region=east"),
        ]);
        assert_eq!(selected(&g, Some(&a)).unwrap(), names(&["a", "b"]));
    }

    #[test]
    fn bad_annotations_are_refused_precisely() {
        let g = gws();
        for (k, v, why) in [
            (
                NODEPOOL_SELECTOR_ANNOTATION,
                "region in (east)",
                "equality form",
            ),
            (NODEPOOL_SELECTOR_ANNOTATION, "region!=east", "not k!=v"),
            (NODEPOOL_SELECTOR_ANNOTATION, "region", "equality form"),
            (NODEPOOL_SELECTOR_ANNOTATION, "", "is empty"),
            (
                NODEPOOL_SELECTOR_ANNOTATION,
                "region=north",
                "selects no gateway",
            ),
            (GATEWAYS_ANNOTATION, "a,c", "\"c\" is not a gateway"),
            (GATEWAYS_ANNOTATION, " , ", "names no gateway"),
        ] {
            let e = selected(&g, Some(&ann(&[(k, v)]))).unwrap_err();
            assert!(e.field.contains(k), "{e}");
            assert_eq!(e.value, format!("{v:?}"));
            assert!(e.reason.contains(why), "{v}: {e}");
        }
        let long = "x".repeat(300);
        let e = selected(&g, Some(&ann(&[(GATEWAYS_ANNOTATION, &long)]))).unwrap_err();
        assert!(e.value.chars().count() <= 104, "{}", e.value);
    }

    #[test]
    fn nodes_belong_to_their_pool_gateway() {
        let scope = GatewayScope {
            gateways: Arc::new(gws()),
            name: "b".into(),
        };
        let labels = |p: &str| ann(&[("apps.openyurt.io/nodepool", p)]);
        assert!(scope.serves_node(&labels("pool-b")));
        assert!(!scope.serves_node(&labels("pool-a")));
        assert!(!scope.serves_node(&labels("other")));
    }
}
