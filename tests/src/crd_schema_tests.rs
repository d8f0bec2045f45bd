//! Unit tests of [`super`]: each rule, and the PoolService schema as deploy/ shipped it before
//! the fix (refused by the API server).

use serde_json::{Value, json};

use super::*;

fn yaml(text: &str) -> Value {
    serde_json::to_value(yaml_serde::from_str::<yaml_serde::Value>(text).expect("YAML"))
        .expect("JSON")
}

/// The errors of `schema` (YAML) as `path: rule` lines, paths relative to the root (`$`).
fn errors(text: &str) -> Vec<String> {
    check_schema(&yaml(text), "$", true)
        .into_iter()
        .map(|e| e.to_string())
        .collect()
}

fn assert_one(text: &str, path: &str, rule_part: &str) {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let (p, rule) = errs[0].split_once(": ").expect("path: rule");
    assert_eq!(p, path, "{errs:?}");
    assert!(rule.contains(rule_part), "{errs:?} lacks {rule_part:?}");
}

/// `status.loadBalancer` of `deploy/components/poolservice/crd.yaml` before the fix:
/// `x-kubernetes-list-type: atomic` of `ports` sat inside `ports.items` (an object), not beside
/// `items`. The API server refused the CRD: `...items.type: Invalid value: "object": must be
/// array if x-kubernetes-list-type is specified`.
const OLD_POOLSERVICE_STATUS: &str = r#"
type: object
properties:
  status:
    type: object
    properties:
      loadBalancer:
        type: object
        properties:
          ingress:
            type: array
            items:
              type: object
              properties:
                ip:
                  type: string
                hostname:
                  type: string
                ipMode:
                  type: string
                ports:
                  type: array
                  items:
                    type: object
                    required: [port, protocol]
                    properties:
                      port:
                        type: integer
                        format: int32
                      protocol:
                        type: string
                      error:
                        type: string
                    x-kubernetes-list-type: atomic
            x-kubernetes-list-type: atomic
"#;

#[test]
fn the_old_poolservice_crd_fails_where_the_api_server_failed() {
    assert_one(
        OLD_POOLSERVICE_STATUS,
        "$.properties[status].properties[loadBalancer].properties[ingress].items\
         .properties[ports].items.type",
        "Invalid value: \"object\": must be array if x-kubernetes-list-type is specified",
    );
    // Moved beside `items` (the fix), it passes.
    let fixed = OLD_POOLSERVICE_STATUS
        .replace(
            "                    x-kubernetes-list-type: atomic\n",
            "",
        )
        .replace(
            "                  items:\n                    type: object\n                    required",
            "                  x-kubernetes-list-type: atomic\n                  items:\n                    type: object\n                    required",
        );
    assert_eq!(errors(&fixed), Vec::<String>::new());
}

#[test]
fn every_node_has_a_type_unless_int_or_string_or_preserving_unknown_fields() {
    assert_one(
        "type: object\nproperties: {a: {description: x}}",
        "$.properties[a].type",
        "Required value: must not be empty for specified object fields",
    );
    assert_one(
        "type: object\nproperties: {a: {type: array, items: {}}}",
        "$.properties[a].items.type",
        "must not be empty for specified array items",
    );
    assert_one("properties: {}", "$.type", "must not be empty at the root");
    assert_one("type: string", "$.type", "must be object at the root");
    let ok = "type: object\nproperties:\n  port: {x-kubernetes-int-or-string: true}\n  \
              raw: {x-kubernetes-preserve-unknown-fields: true}\n  \
              p: {x-kubernetes-int-or-string: true, anyOf: [{type: integer}, {type: string}]}";
    assert_eq!(errors(ok), Vec::<String>::new());
    assert_one(
        "type: object\nproperties: {p: {type: string, x-kubernetes-int-or-string: true}}",
        "$.properties[p].type",
        "must be empty if x-kubernetes-int-or-string is true",
    );
    assert_one(
        "type: object\nproperties: {p: {type: nonsense}}",
        "$.properties[p].type",
        "Unsupported value",
    );
    assert_one(
        "type: object\nx-kubernetes-preserve-unknown-fields: false",
        "$.x-kubernetes-preserve-unknown-fields",
        "must be true or undefined",
    );
}

#[test]
fn list_and_map_extensions_only_on_their_types() {
    assert_one(
        "type: object\nproperties: {a: {x-kubernetes-list-type: set, x-kubernetes-preserve-unknown-fields: true}}",
        "$.properties[a].type",
        "Required value: must be array if x-kubernetes-list-type is specified",
    );
    assert_one(
        "type: object\nproperties: {a: {type: array, items: {type: string}, x-kubernetes-list-type: bag}}",
        "$.properties[a].x-kubernetes-list-type",
        "Unsupported value",
    );
    assert_one(
        "type: object\nproperties: {a: {type: string, x-kubernetes-map-type: atomic}}",
        "$.properties[a].type",
        "must be object if x-kubernetes-map-type is specified",
    );
    assert_one(
        "type: object\nproperties: {a: {type: object, items: {type: string}}}",
        "$.properties[a].items",
        "items is allowed only with type array",
    );
    assert_one(
        "type: object\nproperties: {a: {type: array}}",
        "$.properties[a].items",
        "Required value: must be specified",
    );
    assert_one(
        "type: object\nproperties: {a: {type: array, items: [{type: string}]}}",
        "$.properties[a].items",
        "must be a schema object and not an array",
    );
    assert_one(
        "type: object\nproperties: {a: {type: array, items: {type: object, properties: {o: {type: string}}}, x-kubernetes-list-type: set}}",
        "$.properties[a].items",
        "must be atomic as item of a list with x-kubernetes-list-type=set",
    );
}

#[test]
fn list_map_keys_need_list_type_map_and_required_scalar_properties_of_the_items() {
    let list = |extra: &str| {
        format!(
            "type: object\nproperties:\n  l:\n    type: array\n    {extra}\n    items:\n      \
             type: object\n      required: [name]\n      properties:\n        name: {{type: string}}\n        \
             port: {{type: integer}}\n        sub: {{type: object}}"
        )
    };
    assert_eq!(
        errors(&list(
            "x-kubernetes-list-type: map\n    x-kubernetes-list-map-keys: [name]"
        )),
        Vec::<String>::new()
    );
    assert_one(
        &list("x-kubernetes-list-map-keys: [name]"),
        "$.properties[l].x-kubernetes-list-type",
        "must be map if x-kubernetes-list-map-keys is non-empty",
    );
    assert_one(
        &list("x-kubernetes-list-type: map"),
        "$.properties[l].x-kubernetes-list-map-keys",
        "must not be empty if x-kubernetes-list-type is map",
    );
    assert_one(
        &list("x-kubernetes-list-type: map\n    x-kubernetes-list-map-keys: [port]"),
        "$.properties[l].items.properties[port].default",
        "must have a default or be a required property",
    );
    assert_one(
        &list("x-kubernetes-list-type: map\n    x-kubernetes-list-map-keys: [nope]"),
        "$.properties[l].x-kubernetes-list-map-keys",
        "entries must all be names of item properties",
    );
    let errs = errors(&list(
        "x-kubernetes-list-type: map\n    x-kubernetes-list-map-keys: [sub]",
    ));
    assert!(
        errs.iter()
            .any(|e| e.contains("[sub].type") && e.contains("scalar")),
        "{errs:?}"
    );
}

#[test]
fn properties_and_additional_properties() {
    assert_one(
        "type: object\nproperties: {a: {type: object, properties: {b: {type: string}}, additionalProperties: {type: string}}}",
        "$.properties[a].additionalProperties",
        "additionalProperties and properties are mutual exclusive",
    );
    assert_one(
        "type: object\nproperties: {a: {type: object, additionalProperties: false}}",
        "$.properties[a].additionalProperties",
        "additionalProperties: false is not allowed",
    );
    assert_one(
        "type: object\nadditionalProperties: {type: string}",
        "$.additionalProperties",
        "must not be used at the root",
    );
    assert_eq!(
        errors(
            "type: object\nproperties: {labels: {type: object, additionalProperties: {type: string}}}"
        ),
        Vec::<String>::new()
    );
}

#[test]
fn metadata_at_the_root_restricts_only_name_and_generate_name() {
    let ok = "type: object\nproperties:\n  metadata:\n    type: object\n    properties:\n      \
              name: {type: string, maxLength: 63}\n  kind: {type: string}\n  apiVersion: {type: string}";
    assert_eq!(errors(ok), Vec::<String>::new());
    assert_one(
        "type: object\nproperties: {metadata: {type: object, properties: {labels: {type: object}}}}",
        "$.properties[metadata].properties[labels]",
        "may only restrict name and generateName",
    );
    assert_one(
        "type: object\nproperties: {metadata: {type: object, required: [name]}}",
        "$.properties[metadata].required",
        "may only restrict name and generateName",
    );
    assert_one(
        "type: object\nproperties: {kind: {type: integer}}",
        "$.properties[kind].type",
        "must be string",
    );
}

#[test]
fn unsupported_openapi_features_and_unknown_fields_are_refused() {
    for key in [
        "$ref",
        "definitions",
        "dependencies",
        "id",
        "patternProperties",
    ] {
        let text = format!("type: object\nproperties: {{a: {{type: string, {key:?}: x}}}}");
        assert_one(&text, &format!("$.properties[a].{key}"), "is not supported");
    }
    assert_one(
        "type: object\nproperties: {a: {type: array, items: {type: string}, x-kubernetes-list-typ: atomic}}",
        "$.properties[a].x-kubernetes-list-typ",
        "Unknown field",
    );
    assert_one(
        "type: object\nproperties: {a: {type: array, items: {type: string}, uniqueItems: true}}",
        "$.properties[a].uniqueItems",
        "quadratic",
    );
}

#[test]
fn defaults_only_in_v1_and_not_in_top_level_metadata_or_value_validation() {
    let with_default = "type: object\nproperties: {a: {type: string, default: x}}";
    assert_eq!(errors(with_default), Vec::<String>::new());
    let errs = check_schema(&yaml(with_default), "$", false);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].rule.contains("only in apiextensions.k8s.io/v1"));
    assert_one(
        "type: object\nproperties: {metadata: {type: object, properties: {name: {type: string, default: n}}}}",
        "$.properties[metadata].properties[name].default",
        "must not be set in top-level metadata",
    );
    assert_one(
        "type: object\nproperties: {a: {type: string, anyOf: [{default: x}]}}",
        "$.properties[a].anyOf[0].default",
        "inside value validation",
    );
}

#[test]
fn value_validation_holds_no_structure_and_names_only_fields_specified_outside() {
    assert_one(
        "type: object\nproperties: {a: {type: string, allOf: [{type: string, pattern: x}]}}",
        "$.properties[a].allOf[0].type",
        "must not be used inside value validation",
    );
    assert_one(
        "type: object\nproperties: {a: {type: object, properties: {b: {type: string}}, oneOf: [{required: [b]}, {properties: {c: {minLength: 1}}}]}}",
        "$.properties[a].oneOf[1].properties[c]",
        "must be specified outside of value validation",
    );
    assert_eq!(
        errors(
            "type: object\nproperties: {a: {type: object, properties: {b: {type: string}}, anyOf: [{properties: {b: {minLength: 1}}}, {required: [b]}]}}"
        ),
        Vec::<String>::new()
    );
}

#[test]
fn a_crd_needs_schemas_and_one_storage_version() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "spec": {"versions": [
            {"name": "v1", "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}},
            {"name": "v2", "storage": true},
        ]},
    });
    let errs: Vec<String> = check_crd(&crd).iter().map(ToString::to_string).collect();
    assert_eq!(
        errs,
        [
            "spec.versions: Invalid value: 2: must have exactly one version marked as storage version",
            "spec.versions[1].schema.openAPIV3Schema: Required value: schemas are required",
        ]
    );
}
