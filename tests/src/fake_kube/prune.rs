//! Pruning of custom resources as the API server does it: a field the CRD's structural schema does
//! not specify is dropped on every write (create, update, patch, and of the `status` subresource),
//! unless `x-kubernetes-preserve-unknown-fields: true` keeps it ("Field pruning" in the Kubernetes
//! documentation). The fake prunes PoolServices with the schema of
//! `deploy/components/poolservice/crd.yaml`, so a status field that schema lacks is lost here as
//! it would be in a cluster.
//!
//! At the root, `apiVersion`, `kind` and `metadata` are kept whatever the schema says (the API
//! server handles `metadata` itself: ObjectMeta is never pruned by the schema).

use std::sync::OnceLock;

use serde_json::Value;

/// The `openAPIV3Schema` of deploy/'s PoolService CRD (its first version).
pub(crate) fn pool_service_schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let path = crate::deploy::deploy_dir().join("components/poolservice/crd.yaml");
        let docs = crate::deploy::documents(&path);
        let crd = docs
            .iter()
            .find(|d| d["kind"] == "CustomResourceDefinition")
            .unwrap_or_else(|| panic!("{} holds no CRD", path.display()));
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
    })
}

/// Prunes `obj` (a whole object) against `schema` (an `openAPIV3Schema`); returns the paths
/// dropped (e.g. `.status.loadBalancer.ingress[0].ipMode`).
pub fn prune_object(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut dropped = Vec::new();
    if let Some(map) = obj.as_object_mut() {
        for (k, v) in map.iter_mut() {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match schema.pointer(&format!("/properties/{k}")) {
                Some(s) => prune(s, v, &format!(".{k}"), &mut dropped),
                None if preserves(schema) => {}
                None => dropped.push(format!(".{k}")),
            }
        }
        map.retain(|k, _| {
            matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                || schema.pointer(&format!("/properties/{k}")).is_some()
                || preserves(schema)
        });
    }
    dropped
}

fn preserves(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true)
}

fn prune(schema: &Value, v: &mut Value, path: &str, dropped: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            let props = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keep_all = preserves(schema);
            let mut gone = Vec::new();
            for (k, child) in map.iter_mut() {
                let sub = props.and_then(|p| p.get(k)).or(additional);
                match sub {
                    Some(s) => prune(s, child, &format!("{path}.{k}"), dropped),
                    None if keep_all => {}
                    None => gone.push(k.clone()),
                }
            }
            for k in gone {
                map.remove(&k);
                dropped.push(format!("{path}.{k}"));
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(s, item, &format!("{path}[{i}]"), dropped);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deploys_schema_keeps_a_dual_stack_status_and_drops_what_it_lacks() {
        let mut ps = json!({
            "apiVersion": "network.openyurt.io/v1alpha1", "kind": "PoolService",
            "metadata": {"name": "web-a", "namespace": "default", "labels": {"x": "y"}},
            "spec": {"loadBalancerClass": "c", "nodepoolName": "a", "bogus": 1},
            "status": {
                "loadBalancer": {"ingress": [
                    {"ip": "20.0.0.1", "ipMode": "VIP"},
                    {"ip": "2001:db8::1", "ipMode": "VIP", "family": "IPv6"},
                ]},
                "conditions": [],
                "perFamily": {"IPv6": {}},
            },
        });
        let dropped = prune_object(pool_service_schema(), &mut ps);
        assert_eq!(
            dropped,
            [
                ".spec.bogus",
                ".status.loadBalancer.ingress[1].family",
                ".status.perFamily"
            ]
        );
        assert_eq!(
            ps["status"]["loadBalancer"]["ingress"],
            json!([
                {"ip": "20.0.0.1", "ipMode": "VIP"},
                {"ip": "2001:db8::1", "ipMode": "VIP"},
            ])
        );
        assert_eq!(ps["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn a_schema_without_ip_mode_prunes_it() {
        let schema = json!({"type": "object", "properties": {"status": {"type": "object",
            "properties": {"loadBalancer": {"type": "object", "properties": {"ingress": {
                "type": "array", "items": {"type": "object", "properties": {"ip": {"type": "string"}}}}}}}}}});
        let mut ps =
            json!({"status": {"loadBalancer": {"ingress": [{"ip": "20.0.0.1", "ipMode": "VIP"}]}}});
        assert_eq!(
            prune_object(&schema, &mut ps),
            [".status.loadBalancer.ingress[0].ipMode"]
        );
    }
}
