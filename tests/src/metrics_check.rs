//! A strict parser and checker of the two text formats `/metrics` serves: the Prometheus text
//! exposition format 0.0.4 and OpenMetrics 1.0. It checks what `promtool check metrics` and an
//! OpenMetrics parser would reject, and what the project requires on top: every family has `# HELP`
//! and `# TYPE` (before its samples), every sample belongs to a declared family and uses a sample
//! name its type allows, families are contiguous and not declared twice, label and metric names
//! are valid, label values are escaped, values are numbers, counters are not negative, and every
//! histogram series has ascending cumulative buckets ending with `+Inf` whose count is `_count`.
//! OpenMetrics text must end with `# EOF`; the Prometheus text must not contain OpenMetrics-only
//! lines (`# UNIT`, `# EOF`). Timestamps and exemplars are refused: no clb binary writes them.

use std::collections::{BTreeMap, HashSet};

/// Which text format to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text exposition format 0.0.4 (`text/plain; version=0.0.4`).
    Prometheus,
    /// OpenMetrics 1.0 (`application/openmetrics-text`).
    OpenMetrics,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Sample name (e.g. `clb_server_units_total`, `clb_x_bucket`).
    pub name: String,
    /// Labels in order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// One metric family: its metadata and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// Family name as declared by `# TYPE`.
    pub name: String,
    /// Declared type.
    pub kind: String,
    /// Declared help.
    pub help: String,
    /// Declared unit (OpenMetrics only).
    pub unit: Option<String>,
    /// Samples, in order.
    pub samples: Vec<Sample>,
}

/// A parsed and checked exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Exposition {
    /// Families in order.
    pub families: Vec<Family>,
}

fn valid_metric_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_' || ch == ':')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':')
}

fn valid_label_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => return Ok(f64::INFINITY),
        "-Inf" => return Ok(f64::NEG_INFINITY),
        "NaN" => return Ok(f64::NAN),
        _ => {}
    }
    if s.is_empty()
        || !s
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'))
    {
        return Err(format!("value {s:?} is not a number"));
    }
    s.parse::<f64>()
        .map_err(|e| format!("value {s:?} is not a number: {e}"))
}

/// Label pairs in order.
type Labels = Vec<(String, String)>;

/// Parses `{a="x",b="y"}` at the start of `s`; returns the labels and the rest after `}`.
fn parse_labels(s: &str, format: Format) -> Result<(Labels, &str), String> {
    let mut labels: Labels = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("labels must start with '{'")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("a label has no '='")?;
        let name = &rest[..eq];
        if !valid_label_name(name) {
            return Err(format!("invalid label name {name:?}"));
        }
        if labels.iter().any(|(n, _)| n == name) {
            return Err(format!("label {name:?} repeated"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or_else(|| format!("the value of label {name:?} is not quoted"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("the value of label {name:?} is not closed")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("invalid escape in label {name:?}: {other:?}")),
                },
                Some((_, '\n')) => return Err(format!("raw newline in label {name:?}")),
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((name.to_owned(), value));
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
            if rest.starts_with('}') && format == Format::OpenMetrics {
                return Err("trailing comma in labels".into());
            }
        } else if !rest.starts_with('}') {
            return Err(format!("expected ',' or '}}' after label {name:?}"));
        }
    }
}

/// The sample-name suffixes a family of `kind` may use ("" is the family name itself).
fn suffixes(kind: &str, format: Format) -> Result<&'static [&'static str], String> {
    Ok(match (format, kind) {
        (Format::Prometheus, "counter" | "gauge" | "untyped") => &[""],
        (Format::Prometheus, "histogram") => &["_bucket", "_sum", "_count"],
        (Format::Prometheus, "summary") => &["", "_sum", "_count"],
        (Format::OpenMetrics, "counter") => &["_total", "_created"],
        (Format::OpenMetrics, "gauge" | "unknown" | "stateset") => &[""],
        (Format::OpenMetrics, "info") => &["_info"],
        (Format::OpenMetrics, "histogram") => &["_bucket", "_sum", "_count", "_created"],
        (Format::OpenMetrics, "gaugehistogram") => &["_gbucket", "_gsum", "_gcount"],
        (Format::OpenMetrics, "summary") => &["", "_sum", "_count", "_created"],
        _ => return Err(format!("unknown type {kind:?}")),
    })
}

impl Exposition {
    /// Parses `text` in `format` and checks it (see the module documentation).
    pub fn parse(text: &str, format: Format) -> Result<Self, String> {
        Self::parse_inner(text, format).map_err(|(line, e)| format!("line {line}: {e}"))
    }

    fn parse_inner(text: &str, format: Format) -> Result<Self, (usize, String)> {
        let om = format == Format::OpenMetrics;
        if !text.ends_with('\n') {
            return Err((0, "the text does not end with a newline".into()));
        }
        // Families as declared; `kind` and `help` stay empty until their line is read.
        let mut families: Vec<Family> = Vec::new();
        let mut has_help: Vec<bool> = Vec::new();
        let mut declared: HashSet<String> = HashSet::new();
        let mut seen_eof = false;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let err = |e: String| (n, e);
            if seen_eof {
                return Err(err("text after # EOF".into()));
            }
            if line.is_empty() {
                if om {
                    return Err(err("empty line".into()));
                }
                continue;
            }
            if line == "# EOF" {
                if !om {
                    return Err(err("# EOF in the Prometheus text format".into()));
                }
                seen_eof = true;
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let mut parts = comment.trim_start().splitn(3, ' ');
                let keyword = parts.next().unwrap_or("");
                let name = parts.next().unwrap_or("");
                let rest = parts.next().unwrap_or("");
                match keyword {
                    "HELP" | "TYPE" | "UNIT" => {}
                    _ if om => return Err(err(format!("unexpected comment {line:?}"))),
                    _ => continue,
                }
                if keyword == "UNIT" && !om {
                    return Err(err("# UNIT in the Prometheus text format".into()));
                }
                if !valid_metric_name(name) {
                    return Err(err(format!("invalid metric name {name:?}")));
                }
                let open = families
                    .last()
                    .is_some_and(|f| f.name == name && f.samples.is_empty());
                if !open {
                    if !declared.insert(name.to_owned()) {
                        return Err(err(format!("family {name} declared twice (or split)")));
                    }
                    families.push(Family {
                        name: name.to_owned(),
                        kind: String::new(),
                        help: String::new(),
                        unit: None,
                        samples: Vec::new(),
                    });
                    has_help.push(false);
                }
                let f = families.last_mut().expect("pushed above");
                let dup = match keyword {
                    "HELP" => std::mem::replace(has_help.last_mut().expect("pushed"), true),
                    "TYPE" => !f.kind.is_empty(),
                    _ => f.unit.is_some(),
                };
                if dup {
                    return Err(err(format!("second {keyword} of {name}")));
                }
                match keyword {
                    "HELP" => f.help = rest.to_owned(),
                    "TYPE" => {
                        suffixes(rest, format).map_err(err)?;
                        if om && rest == "counter" && name.ends_with("_total") {
                            return Err(err(format!(
                                "counter family {name} must not end with _total"
                            )));
                        }
                        f.kind = rest.to_owned();
                    }
                    _ => {
                        if !name.ends_with(&format!("_{rest}")) {
                            return Err(err(format!(
                                "family {name} does not end with its unit {rest:?}"
                            )));
                        }
                        f.unit = Some(rest.to_owned());
                    }
                }
                continue;
            }
            // A sample.
            let name_end = line
                .find(['{', ' '])
                .ok_or_else(|| err("a sample without a value".into()))?;
            let name = &line[..name_end];
            if !valid_metric_name(name) {
                return Err(err(format!("invalid metric name {name:?}")));
            }
            let (labels, rest) = if line[name_end..].starts_with('{') {
                parse_labels(&line[name_end..], format).map_err(err)?
            } else {
                (Vec::new(), &line[name_end..])
            };
            let rest = rest
                .strip_prefix(' ')
                .ok_or_else(|| err("no space before the value".into()))?;
            if rest.contains(" # ") || rest.contains('#') {
                return Err(err("exemplars are not expected".into()));
            }
            let mut fields = rest.split(' ');
            let value = parse_value(fields.next().unwrap_or("")).map_err(err)?;
            if fields.next().is_some() {
                return Err(err("timestamps (or extra fields) are not expected".into()));
            }
            let Some(family) = families.last_mut() else {
                return Err(err(format!("sample {name} before any HELP/TYPE")));
            };
            if family.kind.is_empty() || !has_help.last().copied().unwrap_or(false) {
                return Err(err(format!(
                    "family {} has no HELP or no TYPE before its samples",
                    family.name
                )));
            }
            let allowed = suffixes(&family.kind, format).map_err(err)?;
            let belongs = allowed
                .iter()
                .any(|s| name.strip_suffix(s) == Some(family.name.as_str()));
            if !belongs {
                // Either it has no family, or its family was declared earlier (not contiguous).
                return Err(err(format!(
                    "sample {name} does not belong to the family being listed ({} {}): no HELP/TYPE \
                     for it, or its family is split",
                    family.name, family.kind
                )));
            }
            if family.kind == "counter" && (value.is_nan() || value < 0.0) {
                return Err(err(format!("counter sample {name} is {value}")));
            }
            if name.ends_with("_bucket") && !labels.iter().any(|(n, _)| n == "le") {
                return Err(err(format!("bucket {name} has no le label")));
            }
            family.samples.push(Sample {
                name: name.to_owned(),
                labels,
                value,
            });
        }
        if om && !seen_eof {
            return Err((text.lines().count(), "no # EOF at the end".into()));
        }
        for (f, help) in families.iter().zip(&has_help) {
            if f.kind.is_empty() || !help {
                return Err((0, format!("family {} has no HELP or no TYPE", f.name)));
            }
            if f.kind == "histogram" {
                check_histogram(f).map_err(|e| (0, e))?;
            }
        }
        Ok(Self { families })
    }

    /// The family named `name` (its declared name).
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// The value of the first sample named `name` whose labels include every pair of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.families
            .iter()
            .flat_map(|f| &f.samples)
            .find(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.value)
    }
}

/// Per series (labels without `le`): ascending `le`, non-decreasing counts, a `+Inf` bucket equal
/// to `_count`, and a `_sum`.
fn check_histogram(f: &Family) -> Result<(), String> {
    type Key = Vec<(String, String)>;
    let mut buckets: BTreeMap<Key, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<Key, f64> = BTreeMap::new();
    let mut sums: HashSet<Key> = HashSet::new();
    for s in &f.samples {
        let key: Key = s
            .labels
            .iter()
            .filter(|(n, _)| n != "le")
            .cloned()
            .collect();
        if s.name.ends_with("_bucket") {
            let le = s
                .labels
                .iter()
                .find(|(n, _)| n == "le")
                .map(|(_, v)| v.as_str());
            let le = parse_value(le.unwrap_or("")).map_err(|e| format!("{}: le: {e}", f.name))?;
            buckets.entry(key).or_default().push((le, s.value));
        } else if s.name.ends_with("_count") {
            counts.insert(key, s.value);
        } else if s.name.ends_with("_sum") {
            sums.insert(key);
        }
    }
    for (key, bs) in &buckets {
        if !bs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1) {
            return Err(format!(
                "{} {key:?}: buckets not ascending and cumulative",
                f.name
            ));
        }
        let Some(&(le, inf)) = bs.last() else {
            continue;
        };
        if le != f64::INFINITY {
            return Err(format!("{} {key:?}: no +Inf bucket", f.name));
        }
        if counts.get(key) != Some(&inf) {
            return Err(format!(
                "{} {key:?}: _count differs from the +Inf bucket",
                f.name
            ));
        }
        if !sums.contains(key) {
            return Err(format!("{} {key:?}: no _sum", f.name));
        }
    }
    if counts.keys().any(|k| !buckets.contains_key(k)) {
        return Err(format!("{}: a series with _count but no buckets", f.name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROM: &str = "# HELP a_total Things\n# TYPE a_total counter\na_total{x=\"1\"} 3\n\
        # HELP h_seconds Waits\n# TYPE h_seconds histogram\n\
        h_seconds_sum 0.7\nh_seconds_count 1\nh_seconds_bucket{le=\"0.5\"} 0\nh_seconds_bucket{le=\"+Inf\"} 1\n";
    const OM: &str = "# HELP a Things\n# TYPE a counter\na_total{x=\"1\"} 3\n\
        # HELP h_seconds Waits\n# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n\
        h_seconds_sum 0.7\nh_seconds_count 1\nh_seconds_bucket{le=\"0.5\"} 0\nh_seconds_bucket{le=\"+Inf\"} 1\n# EOF\n";

    #[test]
    fn well_formed_texts_parse() {
        let p = Exposition::parse(PROM, Format::Prometheus).unwrap();
        assert_eq!(p.value("a_total", &[("x", "1")]), Some(3.0));
        let o = Exposition::parse(OM, Format::OpenMetrics).unwrap();
        assert_eq!(
            o.family("h_seconds").unwrap().unit.as_deref(),
            Some("seconds")
        );
        assert_eq!(o.value("h_seconds_count", &[]), Some(1.0));
    }

    #[test]
    fn what_promtool_or_an_openmetrics_parser_rejects_is_rejected() {
        let bad_prom = [
            // The OpenMetrics counter naming: no HELP for a_total (promtool's "no help text").
            "# HELP a Things\n# TYPE a counter\na_total 3\n",
            "# TYPE a gauge\na 1\n",
            "# HELP a x\n# TYPE a gauge\na 1\n# EOF\n",
            "# HELP a x\n# TYPE a gauge\na{b=\"1} 1\n",
            "# HELP a x\n# TYPE a gauge\na one\n",
            "# HELP a x\n# TYPE a gauge\nb 1\n",
            "# HELP a x\n# TYPE a gauge\na 1\n# HELP a x\n# TYPE a gauge\n",
            "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n",
            "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 1\nh_sum 1\n",
            "# HELP a x\n# TYPE a gauge\na{b=\"\\q\"} 1\n",
        ];
        for text in bad_prom {
            assert!(
                Exposition::parse(text, Format::Prometheus).is_err(),
                "accepted:\n{text}"
            );
        }
        let bad_om = [
            PROM,
            "# HELP a Things\n# TYPE a counter\na_total 3\n",
            "# HELP a_total x\n# TYPE a_total counter\na_total 3\n# EOF\n",
            "# HELP a x\n# TYPE a gauge\n\na 1\n# EOF\n",
            "# HELP a x\n# TYPE a gauge\n# UNIT a seconds\na 1\n# EOF\n",
        ];
        for text in bad_om {
            assert!(
                Exposition::parse(text, Format::OpenMetrics).is_err(),
                "accepted:\n{text}"
            );
        }
    }
}
