//! `clbctl apply -f FILE`: a YAML or JSON list of updates, sent with `Writer.Apply`.
//!
//! The file is a list of items, one update each, told apart by `kind`:
//!
//! ```yaml
//! - {kind: service, op: add, id: 0f6c2a4e-svc-uid, ports: [{port: 80, protocol: TCP, target_port: 8080}]}
//! - {kind: egress, op: add, id: egress-a}
//! - {kind: pod, op: add, address: 10.1.0.5, location: 10.0.0.1, egress: egress-a, key: ns/web-0, uid: 4c1d}
//! - {kind: endpoints, service: 0f6c2a4e-svc-uid, endpoints: [{address: 10.1.0.5, location: 10.0.0.1}]}
//! - {kind: endpoints, service: 0f6c2a4e-svc-uid, old: [], new: [{address: 10.1.0.6, location: 10.0.0.2}]}
//! - {kind: pod, op: remove, address: 10.1.0.5, location: 10.0.0.1, key: ns/web-0, uid: 4c1d}
//! ```
//!
//! The whole file is read and checked before anything is sent: a malformed file (bad YAML or JSON,
//! an unknown kind, op or field, a field that does not belong to the item's kind, a missing
//! field) fails with its position (line and column) and the index of the item, and nothing is
//! sent. The state server then validates every update (IP addresses, identities, families) and
//! applies the valid ones; each rejected one is printed with its index in the file, the field, the
//! value and the reason, and the command exits 1.

use std::cell::Cell;
use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use clb_proto::v1::{Protocol, ServicePort, Update};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::{Global, Output, out, print_json};
use clb_client::client::Rejected;
use clb_client::updates;

/// `clbctl apply`.
#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    /// The file of updates (YAML or JSON, by extension or sniffed); `-` reads stdin.
    #[arg(long, short = 'f', value_name = "FILE")]
    pub file: String,
    /// The writer's name, shown in the server's status and traces.
    #[arg(long, default_value = "clbctl")]
    pub writer: String,
    /// Ask the state server to validate the updates without applying them: each is checked in
    /// order against a copy of the gateway's desired state, and the rejections are reported as a
    /// real apply would report them. Nothing changes.
    #[arg(long)]
    pub dry_run: bool,
}

/// The format of an updates file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML (`.yaml`, `.yml`).
    Yaml,
    /// JSON (`.json`).
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Json => "JSON",
        })
    }
}

impl Format {
    /// By extension (`.json`, `.yaml`, `.yml`), else sniffed: JSON when the text starts with `[` or
    /// `{`, YAML otherwise.
    pub fn detect(path: &str, text: &str) -> Self {
        let ext = Path::new(path)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("json") => Format::Json,
            Some("yaml" | "yml") => Format::Yaml,
            _ => match text
                .trim_start_matches('\u{feff}')
                .trim_start()
                .chars()
                .next()
            {
                Some('[' | '{') => Format::Json,
                _ => Format::Yaml,
            },
        }
    }
}

/// Add or remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Add (or replace).
    Add,
    /// Remove.
    Remove,
}

/// What an item changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An inbound identity (LoadBalancer Service).
    Service,
    /// An outbound identity.
    Egress,
    /// A pod (address at a location, optional egress).
    Pod,
    /// The endpoints of an inbound identity.
    Endpoints,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Service => "service",
            Kind::Egress => "egress",
            Kind::Pod => "pod",
            Kind::Endpoints => "endpoints",
        })
    }
}

/// A port's protocol (`TCP` or `UDP`, any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum ProtocolName {
    /// TCP.
    #[serde(rename = "TCP", alias = "tcp", alias = "Tcp")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP", alias = "udp", alias = "Udp")]
    Udp,
}

/// One port of a service.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PortItem {
    /// 1 to 65535.
    pub port: u16,
    /// The protocol; TCP when omitted.
    #[serde(default = "tcp")]
    pub protocol: ProtocolName,
    /// The port the pods listen on (the load-balancing rule's backend port), 1 to 65535; the same
    /// as `port` when omitted (or 0). Also accepted as `targetPort`.
    #[serde(default, alias = "targetPort", skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u16>,
}

fn tcp() -> ProtocolName {
    ProtocolName::Tcp
}

/// One endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointItem {
    /// The pod IP.
    pub address: String,
    /// The node IP.
    pub location: String,
}

/// One item of an updates file, as written: every field of every kind, checked against `kind` by
/// [`Item::check`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// What the item changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// Add or remove (service, egress, pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<Op>,
    /// The identity (service, egress).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The ports (service add).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PortItem>>,
    /// The pod IP (pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The node IP (pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The pod's egress (pod add).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<String>,
    /// The pod's `namespace/name` (pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The pod's UID (pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The service whose endpoints these are (endpoints).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The complete set of endpoints (endpoints, level).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<EndpointItem>>,
    /// The endpoints before (endpoints, edge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<Vec<EndpointItem>>,
    /// The endpoints after (endpoints, edge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<Vec<EndpointItem>>,
}

impl Item {
    fn present(&self) -> [(&'static str, bool); 12] {
        [
            ("op", self.op.is_some()),
            ("id", self.id.is_some()),
            ("ports", self.ports.is_some()),
            ("address", self.address.is_some()),
            ("location", self.location.is_some()),
            ("egress", self.egress.is_some()),
            ("key", self.key.is_some()),
            ("uid", self.uid.is_some()),
            ("service", self.service.is_some()),
            ("endpoints", self.endpoints.is_some()),
            ("old", self.old.is_some()),
            ("new", self.new.is_some()),
        ]
    }

    /// Checks that the item has the fields its kind needs and no other.
    pub fn check(&self) -> Result<(), String> {
        let kind = self
            .kind
            .ok_or("missing field `kind` (one of service, egress, pod, endpoints)".to_owned())?;
        let (required, optional): (&[&str], &[&str]) = match kind {
            Kind::Service => (&["op", "id"], &["ports"]),
            Kind::Egress => (&["op", "id"], &[]),
            Kind::Pod => (&["op", "address", "location"], &["egress", "key", "uid"]),
            Kind::Endpoints => (&["service"], &["endpoints", "old", "new"]),
        };
        let present = self.present();
        for (field, is) in present {
            if is && !required.contains(&field) && !optional.contains(&field) {
                return Err(format!(
                    "field `{field}` does not apply to kind {kind} (it takes {})",
                    required
                        .iter()
                        .chain(optional)
                        .map(|f| format!("`{f}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        for field in required {
            if !present.iter().any(|(f, is)| f == field && *is) {
                return Err(format!("missing field `{field}` for kind {kind}"));
            }
        }
        if kind == Kind::Endpoints {
            match (&self.endpoints, &self.old, &self.new) {
                (Some(_), None, None) | (None, Some(_), Some(_)) => {}
                (Some(_), _, _) => {
                    return Err(
                        "kind endpoints takes either `endpoints` (the whole set) or \
                                `old` and `new` (a change), not both"
                            .to_owned(),
                    );
                }
                (None, None, None) => {
                    return Err(
                        "missing field `endpoints` (the whole set) or `old` and `new` \
                                (a change) for kind endpoints"
                            .to_owned(),
                    );
                }
                (None, _, _) => {
                    return Err(
                        "a change of endpoints needs both `old` and `new` (use [] for none)"
                            .to_owned(),
                    );
                }
            }
        }
        if self.egress.is_some() && self.op == Some(Op::Remove) {
            return Err("field `egress` does not apply to a pod removal".to_owned());
        }
        if self.ports.is_some() && self.op == Some(Op::Remove) {
            return Err("field `ports` does not apply to a service removal".to_owned());
        }
        Ok(())
    }

    /// The update this (checked) item stands for.
    pub fn to_update(&self) -> Update {
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        let eps = |v: &Option<Vec<EndpointItem>>| {
            v.iter()
                .flatten()
                .map(|e| updates::endpoint(&e.address, &e.location))
                .collect::<Vec<_>>()
        };
        let add = self.op != Some(Op::Remove);
        match self.kind.unwrap_or(Kind::Pod) {
            Kind::Service if add => {
                let ports: Vec<ServicePort> = self
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| {
                        updates::port_to(
                            p.port,
                            match p.protocol {
                                ProtocolName::Tcp => Protocol::Tcp,
                                ProtocolName::Udp => Protocol::Udp,
                            },
                            p.target_port.unwrap_or(0),
                        )
                    })
                    .collect();
                updates::service_add(&s(&self.id), &ports)
            }
            Kind::Service => updates::service_remove(&s(&self.id)),
            Kind::Egress if add => updates::egress_add(&s(&self.id)),
            Kind::Egress => updates::egress_remove(&s(&self.id)),
            Kind::Pod if add => updates::pod_add(
                &s(&self.address),
                &s(&self.location),
                &s(&self.egress),
                &s(&self.key),
                &s(&self.uid),
            ),
            Kind::Pod => updates::pod_remove(
                &s(&self.address),
                &s(&self.location),
                &s(&self.key),
                &s(&self.uid),
            ),
            Kind::Endpoints if self.endpoints.is_some() => {
                updates::endpoints_level(&s(&self.service), eps(&self.endpoints))
            }
            Kind::Endpoints => {
                updates::endpoints_edge(&s(&self.service), eps(&self.old), eps(&self.new))
            }
        }
    }
}

/// Deserializes one item and checks it inside the map visit, so that the format's deserializer
/// attaches the item's position to a check failure.
struct ItemSeed;

impl<'de> DeserializeSeed<'de> for ItemSeed {
    type Value = Item;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Item, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed {
    type Value = Item;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an update: a mapping with `kind` and the fields of that kind")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
        let item = Item::deserialize(de::value::MapAccessDeserializer::new(map))?;
        item.check().map_err(de::Error::custom)?;
        Ok(item)
    }
}

/// The list of items; `current` follows the index of the item being read, for error messages.
struct ItemsSeed<'a> {
    current: &'a Cell<Option<usize>>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Vec<Item>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Item>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Vec<Item>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of updates")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Item>, A::Error> {
        let mut items = Vec::new();
        loop {
            self.current.set(Some(items.len()));
            match seq.next_element_seed(ItemSeed)? {
                Some(item) => items.push(item),
                None => break,
            }
        }
        self.current.set(None);
        Ok(items)
    }
}

/// Parses an updates file. The error names the item's index (when the failure is inside an item)
/// and the position the parser reports (line and column).
pub fn parse(text: &str, format: Format) -> Result<Vec<Item>, String> {
    let text = text.trim_start_matches('\u{feff}');
    if text.trim().is_empty() {
        return Err("the file is empty; expected a list of updates".to_owned());
    }
    let current = Cell::new(None);
    let seed = ItemsSeed { current: &current };
    let result = match format {
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            seed.deserialize(&mut de)
                .and_then(|items| de.end().map(|()| items))
                .map_err(|e| e.to_string())
        }
        Format::Yaml => seed
            .deserialize(yaml_serde::Deserializer::from_str(text))
            .map_err(|e| e.to_string()),
    };
    result.map_err(|e| match current.get() {
        Some(i) => format!("item {i}: {}", without_item_path(&e, i)),
        None => e,
    })
}

/// yaml_serde starts its messages with the path of the value (`.[3].op: …`); the item's index is
/// already said, so `.[3]` is dropped and the rest named as a field (`field op: …`).
fn without_item_path(message: &str, index: usize) -> String {
    let prefix = format!(".[{index}]");
    let Some(rest) = message.strip_prefix(&prefix) else {
        return message.to_owned();
    };
    if let Some(rest) = rest.strip_prefix(": ") {
        return rest.to_owned();
    }
    match rest.strip_prefix('.').and_then(|r| r.split_once(": ")) {
        Some((field, msg)) => format!("field `{field}`: {msg}"),
        None => message.to_owned(),
    }
}

/// The field of the file that a server-side field path (`updates[3].pod.outbound_identity`)
/// stands for (`egress`).
pub fn file_field(server_field: &str) -> String {
    let path = match server_field.split_once("].") {
        Some((head, rest)) if head.starts_with("updates[") => rest,
        _ => server_field,
    };
    // The identity is `id` in the file's `service` and `egress` updates, `service` in its
    // `endpoints` and `egress` in its `pod` updates (the wire's `service_id` and `egress_id`).
    let (path, id) = [
        ("pod.", "egress"),
        ("service.", "id"),
        ("egress.", "id"),
        ("endpoints.", "service"),
    ]
    .into_iter()
    .find_map(|(kind, id)| path.strip_prefix(kind).map(|rest| (rest, id)))
    .unwrap_or((path, "id"));
    let path = path
        .replace("level.endpoints", "endpoints")
        .replace("edge.old_endpoints", "old")
        .replace("edge.new_endpoints", "new")
        .replace("service_id", id)
        .replace("egress_id", id)
        .replace("pod_key", "key")
        .replace("pod_uid", "uid")
        .replace("operation", "op");
    if path.is_empty() {
        server_field.to_owned()
    } else {
        path
    }
}

/// A rejected item as `clbctl apply` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct RejectedView {
    /// The item's index in the file (0-based).
    pub index: usize,
    /// The item's kind.
    pub kind: String,
    /// The field at fault, as named in the file.
    pub field: String,
    /// The field path as the server names it.
    pub server_field: String,
    /// The value received.
    pub value: String,
    /// Why it was rejected.
    pub reason: String,
}

/// What `clbctl apply` did.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyView {
    /// The file (`-` for stdin).
    pub file: String,
    /// The writer's name.
    pub writer: String,
    /// The gateway (empty: the server's default).
    pub gateway: String,
    /// Whether the server only validated the items (`--dry-run`): `applied` then counts the items
    /// that would be applied, and nothing changed.
    pub dry_run: bool,
    /// Items in the file.
    pub updates: usize,
    /// Items applied.
    pub applied: u64,
    /// The revision after the last batch.
    pub revision: u64,
    /// The rejected items.
    pub rejected: Vec<RejectedView>,
}

fn rejected_view(items: &[Item], r: &Rejected) -> RejectedView {
    RejectedView {
        index: r.position,
        kind: items
            .get(r.position)
            .and_then(|i| i.kind)
            .map_or_else(|| "?".to_owned(), |k| k.to_string()),
        field: file_field(&r.error.field),
        server_field: r.error.field.clone(),
        value: r.error.value.clone(),
        reason: r.error.reason.clone(),
    }
}

fn read(file: &str) -> anyhow::Result<String> {
    if file == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read the updates from stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {file}"))
    }
}

/// Runs `clbctl apply`.
pub async fn run(global: &Global, args: &ApplyArgs) -> anyhow::Result<ExitCode> {
    let name = if args.file == "-" {
        "stdin"
    } else {
        args.file.as_str()
    };
    let text = read(&args.file)?;
    let format = Format::detect(&args.file, &text);
    let items = parse(&text, format)
        .map_err(|e| anyhow::anyhow!("{name} is not a valid {format} list of updates: {e}"))?;
    let batch: Vec<Update> = items.iter().map(Item::to_update).collect();
    let client = global.connect().await.with_context(|| {
        format!(
            "apply: cannot reach the state server at {}",
            global.server()
        )
    })?;
    let mut writer = client.writer(args.writer.clone());
    let outcome = if args.dry_run {
        writer.validate(batch).await
    } else {
        writer.apply(batch).await
    }
    .with_context(|| format!("apply {name}"))?;
    let view = ApplyView {
        file: args.file.clone(),
        writer: args.writer.clone(),
        gateway: global.gateway.clone(),
        dry_run: args.dry_run,
        updates: items.len(),
        applied: outcome.applied,
        revision: outcome.revision,
        rejected: outcome
            .rejected
            .iter()
            .map(|r| rejected_view(&items, r))
            .collect(),
    };
    match global.output {
        Output::Json => print_json(&view)?,
        Output::Table if view.dry_run => out(&format!(
            "{} of {} updates from {name} as {:?} would be applied; nothing changed (--dry-run, \
             revision {})\n",
            view.applied, view.updates, view.writer, view.revision
        )),
        Output::Table => out(&format!(
            "applied {} of {} updates from {name} as {:?} (revision {})\n",
            view.applied, view.updates, view.writer, view.revision
        )),
    }
    if view.rejected.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    if view.dry_run {
        eprintln!(
            "error: the state server would reject {} of {} updates from {name} (--dry-run: \
             nothing was applied):",
            view.rejected.len(),
            view.updates,
        );
    } else {
        eprintln!(
            "error: the state server rejected {} of {} updates from {name} (a rejected update \
             changes nothing; the other {} were applied):",
            view.rejected.len(),
            view.updates,
            view.applied,
        );
    }
    for r in &view.rejected {
        eprintln!(
            "  item {} ({}): field `{}` = {:?}: {}",
            r.index, r.kind, r.field, r.value, r.reason
        );
    }
    Ok(ExitCode::FAILURE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clb_proto::v1::update::Kind as UKind;

    const GOOD: &str = "\
- {kind: service, op: add, id: svc-a, ports: [{port: 80, protocol: TCP, target_port: 8080}, {port: 53, protocol: udp}]}
- {kind: egress, op: add, id: egress-a}
- {kind: pod, op: add, address: 10.1.0.5, location: 10.0.0.1, egress: egress-a, key: ns/p, uid: u1}
- {kind: endpoints, service: svc-a, endpoints: [{address: 10.1.0.5, location: 10.0.0.1}]}
- {kind: endpoints, service: svc-a, old: [], new: [{address: 10.1.0.6, location: 10.0.0.2}]}
- {kind: pod, op: remove, address: 10.1.0.5, location: 10.0.0.1}
- {kind: service, op: remove, id: svc-a}
";

    #[test]
    fn every_kind_parses_and_converts() {
        let items = parse(GOOD, Format::Yaml).expect("valid");
        assert_eq!(items.len(), 7);
        let updates: Vec<Update> = items.iter().map(Item::to_update).collect();
        match &updates[0].kind {
            Some(UKind::Service(s)) => {
                assert_eq!(s.service_id, "svc-a");
                assert_eq!(s.ports.len(), 2);
                assert_eq!(s.ports[1].protocol, Protocol::Udp as i32);
                // The pods' port; none given is the same as the port (0).
                assert_eq!((s.ports[0].port, s.ports[0].target_port), (80, 8080));
                assert_eq!((s.ports[1].port, s.ports[1].target_port), (53, 0));
            }
            other => panic!("{other:?}"),
        }
        match &updates[2].kind {
            Some(UKind::Pod(p)) => {
                assert_eq!(p.egress_id, "egress-a");
                assert_eq!(p.pod_key, "ns/p");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&updates[4].kind, Some(UKind::Endpoints(e)) if e.change.is_some()));
        let json = serde_json::to_string(&items).expect("encode");
        let again = parse(&json, Format::Json).expect("valid JSON");
        assert_eq!(again, items);
    }

    #[test]
    fn yaml_errors_name_the_item_and_the_position() {
        let text = "- {kind: egress, op: add, id: e}\n- kind: pod\n  op: ad\n  address: x\n";
        let e = parse(text, Format::Yaml).unwrap_err();
        assert!(
            e.starts_with("item 1: field `op`: unknown variant `ad`"),
            "{e}"
        );
        assert!(e.contains("line 3 column"), "{e}");

        let text = "- {kind: egress, op: add, id: e}\n- kind: pod\n  op: add\n  location: y\n";
        let e = parse(text, Format::Yaml).unwrap_err();
        assert!(
            e.starts_with("item 1: missing field `address` for kind pod"),
            "{e}"
        );
        assert!(e.contains("line 2 column"), "{e}");

        let e = parse("- {kind: pod, op: add, adress: x}\n", Format::Yaml).unwrap_err();
        assert!(e.contains("unknown field `adress`"), "{e}");
        assert!(e.contains("line 1 column"), "{e}");

        let e = parse(
            "- {kind: egress, op: add, id: e, ports: []}\n",
            Format::Yaml,
        )
        .unwrap_err();
        assert!(e.contains("`ports` does not apply to kind egress"), "{e}");

        let e = parse("- {kind: pod, op: add, location: [1}\n", Format::Yaml).unwrap_err();
        assert!(e.contains("line 1 column"), "{e}");

        let e = parse("kind: pod\n", Format::Yaml).unwrap_err();
        assert!(e.contains("a list of updates"), "{e}");
        assert!(parse("  \n", Format::Yaml).unwrap_err().contains("empty"));
    }

    #[test]
    fn target_ports_are_optional_and_checked() {
        let text = "[{\"kind\":\"service\",\"op\":\"add\",\"id\":\"s\",\"ports\":[{\"port\":80,\"targetPort\":8080},{\"port\":81}]}]";
        let items = parse(text, Format::Json).expect("valid");
        match &items[0].to_update().kind {
            Some(UKind::Service(s)) => {
                let got: Vec<(u32, u32)> =
                    s.ports.iter().map(|p| (p.port, p.target_port)).collect();
                assert_eq!(got, vec![(80, 8080), (81, 0)]);
            }
            other => panic!("{other:?}"),
        }
        // Written back as `target_port`, only when given.
        let json = serde_json::to_string(&items).expect("encode");
        assert!(json.contains("\"target_port\":8080"), "{json}");
        assert_eq!(json.matches("target_port").count(), 1, "{json}");
        let e = parse(
            "- {kind: service, op: add, id: s, ports: [{port: 80, target_port: 70000}]}\n",
            Format::Yaml,
        )
        .unwrap_err();
        assert!(e.starts_with("item 0: "), "{e}");
        assert!(e.contains("70000"), "{e}");
    }

    #[test]
    fn json_errors_name_the_item_and_the_position() {
        let text = "[{\"kind\":\"egress\",\"op\":\"add\",\"id\":\"e\"},\n {\"kind\":\"service\",\"op\":\"add\",\"id\":\"s\",\"ports\":[{\"port\":70000}]}]";
        let e = parse(text, Format::Json).unwrap_err();
        assert!(e.starts_with("item 1: "), "{e}");
        assert!(e.contains("70000"), "{e}");
        assert!(e.contains("line 2 column"), "{e}");
        let text = "[{\"kind\":\"endpoints\",\"service\":\"s\",\"old\":[]}]";
        let e = parse(text, Format::Json).unwrap_err();
        assert!(e.contains("item 0: "), "{e}");
        assert!(e.contains("both `old` and `new`"), "{e}");
        let e = parse(
            "[{\"kind\":\"egress\",\"op\":\"add\",\"id\":\"e\"}] trailing",
            Format::Json,
        )
        .unwrap_err();
        assert!(e.starts_with("trailing characters at line 1"), "{e}");
    }

    #[test]
    fn formats_are_detected_by_extension_then_content() {
        assert_eq!(Format::detect("u.json", "- a"), Format::Json);
        assert_eq!(Format::detect("u.YML", "[]"), Format::Yaml);
        assert_eq!(Format::detect("-", "  [ {} ]"), Format::Json);
        assert_eq!(Format::detect("updates.txt", "- kind: pod"), Format::Yaml);
    }

    #[test]
    fn server_fields_map_to_file_fields() {
        assert_eq!(file_field("updates[3].pod.address"), "address");
        assert_eq!(file_field("updates[0].pod.egress_id"), "egress");
        assert_eq!(file_field("updates[4].endpoints.service_id"), "service");
        assert_eq!(file_field("updates[5].egress.egress_id"), "id");
        assert_eq!(
            file_field("updates[1].endpoints.level.endpoints[2].location"),
            "endpoints[2].location"
        );
        assert_eq!(
            file_field("updates[1].endpoints.edge.old_endpoints[0].address"),
            "old[0].address"
        );
        assert_eq!(file_field("updates[9].service.service_id"), "id");
        assert_eq!(
            file_field("updates[9].service.ports[0].port"),
            "ports[0].port"
        );
        assert_eq!(file_field("updates[2]"), "updates[2]");
    }
}
