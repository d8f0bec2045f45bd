//! The checks the API server makes of a CustomResourceDefinition's schemas before it accepts the
//! CRD: structural schemas ("Specifying a structural schema" in the Kubernetes documentation) and
//! the static validation of `apiextensions-apiserver` (list and map types, forbidden OpenAPI
//! features, defaults). A schema the API server refuses makes `kubectl apply -k` fail: e.g.
//! `x-kubernetes-list-type` on an object is refused with "must be array if
//! x-kubernetes-list-type is specified". Pure: works on the CRD as JSON. Used by
//! `tests/tests/manifests.rs` for every CRD of deploy/.
//!
//! Each error names the node by the API server's field path
//! (`spec.versions[0].schema.openAPIV3Schema.properties[status].items.type`) and the rule.

use std::fmt;

use serde_json::{Map, Value};

/// One violation: where, and which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// The field path of the offending value, as the API server prints it.
    pub path: String,
    /// The rule, worded as the API server's message where it has one.
    pub rule: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.rule)
    }
}

/// The fields of `JSONSchemaProps` (apiextensions.k8s.io/v1); anything else is an unknown field.
const KNOWN: [&str; 44] = [
    "id",
    "$schema",
    "$ref",
    "description",
    "type",
    "format",
    "title",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "allOf",
    "oneOf",
    "anyOf",
    "not",
    "properties",
    "additionalProperties",
    "patternProperties",
    "dependencies",
    "additionalItems",
    "definitions",
    "externalDocs",
    "example",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

/// OpenAPI features CRD schemas do not support.
const UNSUPPORTED: [&str; 6] = [
    "$ref",
    "definitions",
    "dependencies",
    "id",
    "patternProperties",
    "additionalItems",
];

/// What value validation (allOf, anyOf, oneOf, not) may not set: structure belongs outside.
const NOT_IN_VALUE_VALIDATION: [&str; 9] = [
    "description",
    "type",
    "default",
    "additionalProperties",
    "nullable",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
];

const TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];

/// Where a node sits, which decides what it may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// `openAPIV3Schema` itself.
    Root,
    /// A property (or `additionalProperties`) of an object.
    Field,
    /// The `items` of an array.
    Item,
    /// Inside allOf, anyOf, oneOf or not: value validation only.
    ValueValidation,
}

struct Checker {
    /// `apiextensions.k8s.io/v1`: defaults are allowed.
    v1: bool,
    /// Inside the value validation of an `x-kubernetes-int-or-string` node, where
    /// `anyOf: [{type: integer}, {type: string}]` is the allowed form.
    int_or_string_junctor: bool,
    errors: Vec<SchemaError>,
}

fn s<'a>(node: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    node.get(key).and_then(Value::as_str)
}

fn is_true(node: &Map<String, Value>, key: &str) -> bool {
    node.get(key) == Some(&Value::Bool(true))
}

impl Checker {
    fn err(&mut self, path: &str, child: &str, rule: impl Into<String>) {
        let path = if child.is_empty() {
            path.to_owned()
        } else {
            format!("{path}.{child}")
        };
        self.errors.push(SchemaError {
            path,
            rule: rule.into(),
        });
    }

    /// Checks `node` at `path`; `no_defaults` says why a default would be refused here.
    fn node(&mut self, node: &Value, path: &str, level: Level, no_defaults: Option<&str>) {
        let Some(n) = node.as_object() else {
            self.err(path, "", "Invalid value: must be a schema object");
            return;
        };
        let ty = s(n, "type").unwrap_or("");
        let int_or_string = is_true(n, "x-kubernetes-int-or-string");
        let preserve = is_true(n, "x-kubernetes-preserve-unknown-fields");
        for key in n.keys() {
            if !KNOWN.contains(&key.as_str()) {
                self.err(path, key, "Unknown field: not a field of JSONSchemaProps");
            } else if UNSUPPORTED.contains(&key.as_str()) {
                self.err(path, key, format!("Forbidden: {key} is not supported"));
            } else if level == Level::ValueValidation
                && NOT_IN_VALUE_VALIDATION.contains(&key.as_str())
                && !(key == "type" && self.int_or_string_junctor)
            {
                self.err(
                    path,
                    key,
                    "Forbidden: must not be used inside value validation (allOf, anyOf, oneOf, \
                     not): specify the structure outside",
                );
            }
        }
        // Types.
        if !ty.is_empty() && !TYPES.contains(&ty) {
            let rule = if ty == "null" {
                "Forbidden: type cannot be set to null, use nullable as an alternative".to_owned()
            } else {
                format!(
                    "Unsupported value: {ty:?}: supported values: {}",
                    TYPES.join(", ")
                )
            };
            self.err(path, "type", rule);
        }
        if ty.is_empty() && level != Level::ValueValidation && !int_or_string && !preserve {
            let rule = match level {
                Level::Root => "Required value: must not be empty at the root",
                Level::Item => "Required value: must not be empty for specified array items",
                _ => "Required value: must not be empty for specified object fields",
            };
            self.err(path, "type", rule);
        }
        if int_or_string && !ty.is_empty() {
            self.err(
                path,
                "type",
                "Invalid value: must be empty if x-kubernetes-int-or-string is true",
            );
        }
        if level == Level::Root && !ty.is_empty() && ty != "object" {
            self.err(
                path,
                "type",
                format!("Invalid value: {ty:?}: must be object at the root"),
            );
        }
        if n.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
            self.err(
                path,
                "x-kubernetes-preserve-unknown-fields",
                "Invalid value: false: must be true or undefined",
            );
        }
        if is_true(n, "uniqueItems") {
            self.err(
                path,
                "uniqueItems",
                "Forbidden: uniqueItems cannot be set to true since the runtime complexity \
                 becomes quadratic",
            );
        }
        if is_true(n, "x-kubernetes-embedded-resource")
            && (ty != "object" || (!preserve && !n.contains_key("properties")))
        {
            self.err(
                path,
                "x-kubernetes-embedded-resource",
                "Invalid value: needs type object and properties or \
                 x-kubernetes-preserve-unknown-fields",
            );
        }
        // Defaults.
        if n.contains_key("default") {
            if !self.v1 {
                self.err(
                    path,
                    "default",
                    "Forbidden: defaults are allowed only in apiextensions.k8s.io/v1 (structural \
                     schemas)",
                );
            } else if let Some(why) = no_defaults.filter(|_| level != Level::ValueValidation) {
                self.err(path, "default", format!("Forbidden: must not be set {why}"));
            }
        }
        self.arrays(n, path, ty);
        self.maps(n, path, ty, level);
        // Children.
        let field_defaults = |prop: &str| {
            (level == Level::Root && ["metadata", "kind", "apiVersion"].contains(&prop))
                .then_some("in top-level ".to_owned() + prop)
        };
        if let Some(props) = n.get("properties") {
            match props.as_object() {
                Some(props) => {
                    for (k, v) in props {
                        let why = field_defaults(k);
                        let why = why.as_deref().or(no_defaults);
                        let child = format!("{path}.properties[{k}]");
                        let lvl = if level == Level::ValueValidation {
                            level
                        } else {
                            Level::Field
                        };
                        self.node(v, &child, lvl, why);
                    }
                }
                None => self.err(
                    path,
                    "properties",
                    "Invalid value: must be a map of schemas",
                ),
            }
        }
        if let Some(ap) = n.get("additionalProperties").filter(|v| v.is_object()) {
            let lvl = if level == Level::ValueValidation {
                level
            } else {
                Level::Field
            };
            self.node(
                ap,
                &format!("{path}.additionalProperties"),
                lvl,
                no_defaults,
            );
        }
        if let Some(items) = n.get("items").filter(|v| v.is_object()) {
            let lvl = if level == Level::ValueValidation {
                level
            } else {
                Level::Item
            };
            self.node(items, &format!("{path}.items"), lvl, no_defaults);
        }
        let saved = self.int_or_string_junctor;
        self.int_or_string_junctor = int_or_string || (saved && level == Level::ValueValidation);
        for junctor in ["allOf", "anyOf", "oneOf"] {
            for (i, sub) in n
                .get(junctor)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let child = format!("{path}.{junctor}[{i}]");
                self.node(sub, &child, Level::ValueValidation, no_defaults);
                self.specified_outside(sub, n, &child);
            }
        }
        if let Some(not) = n.get("not") {
            self.node(
                not,
                &format!("{path}.not"),
                Level::ValueValidation,
                no_defaults,
            );
            self.specified_outside(not, n, &format!("{path}.not"));
        }
        self.int_or_string_junctor = saved;
        if level == Level::Root {
            self.root(n, path);
        }
    }

    /// `items`, `x-kubernetes-list-type` and `x-kubernetes-list-map-keys`.
    fn arrays(&mut self, n: &Map<String, Value>, path: &str, ty: &str) {
        match n.get("items") {
            Some(Value::Array(_)) => self.err(
                path,
                "items",
                "Forbidden: items must be a schema object and not an array",
            ),
            Some(_) if ty != "array" && !ty.is_empty() => self.err(
                path,
                "items",
                format!("Forbidden: items is allowed only with type array, not {ty:?}"),
            ),
            None if ty == "array" => self.err(path, "items", "Required value: must be specified"),
            _ => {}
        }
        let list_type = s(n, "x-kubernetes-list-type");
        if n.contains_key("x-kubernetes-list-type") && ty != "array" {
            let rule = "must be array if x-kubernetes-list-type is specified";
            if ty.is_empty() {
                self.err(path, "type", format!("Required value: {rule}"));
            } else {
                self.err(path, "type", format!("Invalid value: {ty:?}: {rule}"));
            }
        }
        if let Some(lt) = list_type.filter(|lt| !["atomic", "set", "map"].contains(lt)) {
            self.err(
                path,
                "x-kubernetes-list-type",
                format!(
                    "Unsupported value: {lt:?}: supported values: \"atomic\", \"map\", \"set\""
                ),
            );
        }
        let keys: Vec<&str> = n
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|k| k.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !keys.is_empty() && list_type != Some("map") {
            self.err(
                path,
                "x-kubernetes-list-type",
                "Invalid value: must be map if x-kubernetes-list-map-keys is non-empty",
            );
        }
        let items = n.get("items").and_then(Value::as_object);
        let item_type = items.and_then(|i| s(i, "type")).unwrap_or("");
        if list_type == Some("map") {
            if keys.is_empty() {
                self.err(
                    path,
                    "x-kubernetes-list-map-keys",
                    "Required value: must not be empty if x-kubernetes-list-type is map",
                );
            }
            if items.is_some() && item_type != "object" {
                self.err(
                    path,
                    "items.type",
                    "Invalid value: must be object if parent array's x-kubernetes-list-type is map",
                );
            }
            let item = items.cloned().unwrap_or_default();
            let required: Vec<&str> = item
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let props = item.get("properties").and_then(Value::as_object);
            for (i, k) in keys.iter().enumerate() {
                if keys[..i].contains(k) {
                    self.err(
                        path,
                        "x-kubernetes-list-map-keys",
                        "Invalid value: must not contain duplicate entries",
                    );
                }
                let Some(p) = props.and_then(|p| p.get(*k)).and_then(Value::as_object) else {
                    self.err(
                        path,
                        "x-kubernetes-list-map-keys",
                        format!(
                            "Invalid value: {k:?}: entries must all be names of item properties"
                        ),
                    );
                    continue;
                };
                if matches!(s(p, "type"), Some("array" | "object")) {
                    self.err(
                        path,
                        &format!("items.properties[{k}].type"),
                        "Invalid value: must be a scalar type if parent array's x-kubernetes-list-type is map",
                    );
                }
                if !required.contains(k) && !p.contains_key("default") {
                    self.err(
                        path,
                        &format!("items.properties[{k}].default"),
                        "Required value: this property is in x-kubernetes-list-map-keys, so it \
                         must have a default or be a required property",
                    );
                }
            }
        }
        if list_type == Some("set") {
            let item = items.cloned().unwrap_or_default();
            let atomic = match item_type {
                "object" => s(&item, "x-kubernetes-map-type") == Some("atomic"),
                "array" => s(&item, "x-kubernetes-list-type").is_none_or(|t| t == "atomic"),
                _ => true,
            };
            if !atomic {
                self.err(
                    path,
                    "items",
                    "Invalid value: must be atomic as item of a list with x-kubernetes-list-type=set",
                );
            }
        }
    }

    /// `properties`, `additionalProperties` and `x-kubernetes-map-type`.
    fn maps(&mut self, n: &Map<String, Value>, path: &str, ty: &str, level: Level) {
        if n.contains_key("x-kubernetes-map-type") && ty != "object" {
            let rule = "must be object if x-kubernetes-map-type is specified";
            if ty.is_empty() {
                self.err(path, "type", format!("Required value: {rule}"));
            } else {
                self.err(path, "type", format!("Invalid value: {ty:?}: {rule}"));
            }
        }
        if let Some(mt) =
            s(n, "x-kubernetes-map-type").filter(|t| !["atomic", "granular"].contains(t))
        {
            self.err(
                path,
                "x-kubernetes-map-type",
                format!("Unsupported value: {mt:?}: supported values: \"atomic\", \"granular\""),
            );
        }
        let Some(ap) = n.get("additionalProperties") else {
            return;
        };
        if ap == &Value::Bool(false) {
            self.err(
                path,
                "additionalProperties",
                "Forbidden: additionalProperties: false is not allowed (unknown fields are \
                 pruned; leave it out)",
            );
        } else if n
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| !p.is_empty())
        {
            self.err(
                path,
                "additionalProperties",
                "Forbidden: additionalProperties and properties are mutual exclusive",
            );
        }
        if level == Level::Root {
            self.err(
                path,
                "additionalProperties",
                "Forbidden: must not be used at the root",
            );
        }
    }

    /// `metadata` at the root may restrict only `name` and `generateName` (strings); `kind` and
    /// `apiVersion` are strings.
    fn root(&mut self, n: &Map<String, Value>, path: &str) {
        let props = n.get("properties").and_then(Value::as_object);
        for field in ["kind", "apiVersion"] {
            if let Some(f) = props.and_then(|p| p.get(field)).and_then(Value::as_object)
                && s(f, "type").is_some_and(|t| t != "string")
            {
                self.err(
                    &format!("{path}.properties[{field}]"),
                    "type",
                    "Invalid value: must be string",
                );
            }
        }
        let Some(meta) = props
            .and_then(|p| p.get("metadata"))
            .and_then(Value::as_object)
        else {
            return;
        };
        let mpath = format!("{path}.properties[metadata]");
        if s(meta, "type").is_some_and(|t| t != "object") {
            self.err(&mpath, "type", "Invalid value: must be object");
        }
        for key in meta.keys() {
            if !["type", "description", "properties"].contains(&key.as_str()) {
                self.err(
                    &mpath,
                    key,
                    "Forbidden: metadata at the root may only restrict name and generateName",
                );
            }
        }
        for (k, v) in meta
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if !["name", "generateName"].contains(&k.as_str()) {
                self.err(
                    &format!("{mpath}.properties[{k}]"),
                    "",
                    "Forbidden: metadata at the root may only restrict name and generateName",
                );
            } else if v
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t != "string")
            {
                self.err(
                    &format!("{mpath}.properties[{k}]"),
                    "type",
                    "Invalid value: must be string",
                );
            }
        }
    }

    /// Every field and item a value validation names is specified outside it, in `outside`.
    fn specified_outside(&mut self, inner: &Value, outside: &Map<String, Value>, path: &str) {
        let Some(inner) = inner.as_object() else {
            return;
        };
        let outer_props = outside.get("properties").and_then(Value::as_object);
        for (k, v) in inner
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            match outer_props
                .and_then(|p| p.get(k))
                .and_then(Value::as_object)
            {
                Some(o) => self.specified_outside(v, o, &format!("{path}.properties[{k}]")),
                None => self.err(
                    &format!("{path}.properties[{k}]"),
                    "",
                    "Required value: must be specified outside of value validation (in \
                     properties of the enclosing schema)",
                ),
            }
        }
        if let Some(items) = inner.get("items") {
            match outside.get("items").and_then(Value::as_object) {
                Some(o) => self.specified_outside(items, o, &format!("{path}.items")),
                None => self.err(
                    path,
                    "items",
                    "Required value: must be specified outside of value validation",
                ),
            }
        }
        for junctor in ["allOf", "anyOf", "oneOf"] {
            for sub in inner
                .get(junctor)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.specified_outside(sub, outside, path);
            }
        }
    }
}

/// Checks one `openAPIV3Schema` found at `path`, of a CRD of `apiextensions.k8s.io/v1` (`v1`) or
/// of v1beta1.
pub fn check_schema(schema: &Value, path: &str, v1: bool) -> Vec<SchemaError> {
    let mut c = Checker {
        v1,
        int_or_string_junctor: false,
        errors: Vec::new(),
    };
    c.node(schema, path, Level::Root, None);
    c.errors
}

/// Checks every version's schema of a CustomResourceDefinition (as JSON): each version has one,
/// exactly one version is the storage version, and each schema passes [`check_schema`].
pub fn check_crd(crd: &Value) -> Vec<SchemaError> {
    let v1 = crd["apiVersion"].as_str() == Some("apiextensions.k8s.io/v1");
    let mut errors = Vec::new();
    let versions = crd["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errors.push(SchemaError {
            path: "spec.versions".into(),
            rule: "Required value: must have at least one version".into(),
        });
    }
    let storage = versions
        .iter()
        .filter(|v| v["storage"] == Value::Bool(true))
        .count();
    if storage != 1 {
        errors.push(SchemaError {
            path: "spec.versions".into(),
            rule: format!(
                "Invalid value: {storage}: must have exactly one version marked as storage version"
            ),
        });
    }
    for (i, version) in versions.iter().enumerate() {
        let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
        match version.pointer("/schema/openAPIV3Schema") {
            Some(schema) => errors.extend(check_schema(schema, &path, v1)),
            None if v1 => errors.push(SchemaError {
                path,
                rule: "Required value: schemas are required".into(),
            }),
            None => {}
        }
    }
    errors
}

#[cfg(test)]
#[path = "crd_schema_tests.rs"]
mod tests;
