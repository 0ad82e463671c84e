//! A domain's file read into its tree: every field checked, the offending one named,
//! and the fixed-window rules its limits are counted under.

use std::collections::BTreeMap;

use super::*;

impl EnvoyDomain {
    /// Reads a domain's file from its JSON form (YAML is turned into JSON first); the error
    /// names the field (`descriptors[0].rate_limit.unit`).
    pub fn from_value(value: &serde_json::Value) -> Result<Self, PolicyError> {
        // `counting` is Spillway's, beside the file's own fields.
        let counting = match value.get("counting") {
            None | Some(serde_json::Value::Null) => None,
            Some(raw) => Some(
                raw.as_str()
                    .ok_or_else(|| "must be a string".to_owned())
                    .and_then(Counting::parse)
                    .map_err(|m| PolicyError::field("counting", m))?,
            ),
        };
        let file = match (value, counting) {
            (serde_json::Value::Object(obj), Some(_)) => {
                let mut obj = obj.clone();
                obj.remove("counting");
                std::borrow::Cow::Owned(serde_json::Value::Object(obj))
            }
            _ => std::borrow::Cow::Borrowed(value),
        };
        let doc: DomainDoc = serde_path_to_error::deserialize(file.as_ref()).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "body".to_owned() } else { path };
            PolicyError::field(field, e.inner().to_string())
        })?;
        Ok(Self {
            counting,
            counts: counting.unwrap_or_default(),
            ..Self::from_doc(doc)?
        })
    }

    /// Validates `doc` and builds the tree.
    pub fn from_doc(doc: DomainDoc) -> Result<Self, PolicyError> {
        if doc.domain.is_empty() {
            return Err(PolicyError::field("domain", "is required"));
        }
        text("domain", &doc.domain)?;
        policy_name(&doc.domain).map_err(|m| PolicyError::field("domain", m))?;
        let mut built = EnvoyDomain {
            doc: DomainDoc::default(),
            counting: None,
            counts: Counting::default(),
            quota_all: false,
            limits: Vec::new(),
            nodes: Vec::new(),
            root: Level::default(),
        };
        let mut root = Level::default();
        built.add_level(&doc.descriptors, "descriptors", 1, &mut root)?;
        built.root = root;
        built.doc = doc;
        Ok(built)
    }

    fn add_level(
        &mut self,
        descriptors: &[DescriptorDoc],
        path: &str,
        depth: usize,
        level: &mut Level,
    ) -> Result<(), PolicyError> {
        if depth > MAX_DEPTH {
            return Err(PolicyError::field(
                path,
                format!("descriptors nest at most {MAX_DEPTH} deep"),
            ));
        }
        let mut seen: BTreeMap<(&str, Option<&str>), usize> = BTreeMap::new();
        for (i, d) in descriptors.iter().enumerate() {
            let here = format!("{path}[{i}]");
            check_descriptor(d, &here)?;
            if let Some(first) = seen.insert((d.key.as_str(), d.value.as_deref()), i) {
                return Err(repeated(d, &here, &format!("{path}[{first}]")));
            }
            if self.nodes.len() >= MAX_NODES {
                return Err(PolicyError::field(
                    here,
                    format!("a domain holds at most {MAX_NODES} descriptors"),
                ));
            }
            let limit = match &d.rate_limit {
                None => None,
                Some(rl) => Some(self.add_limit(rl, d, &here)?),
            };
            let index = self.nodes.len();
            self.nodes.push(Node::default());
            let mut children = Level::default();
            self.add_level(
                &d.descriptors,
                &format!("{here}.descriptors"),
                depth + 1,
                &mut children,
            )?;
            self.nodes[index] = Node {
                limit,
                shares: d.share_threshold,
                value_to_metric: d.value_to_metric,
                children,
            };
            match d.value.as_deref() {
                None => {
                    level.any.insert(d.key.clone(), index);
                }
                Some(v) if v.contains('*') => level
                    .wildcards
                    .entry(d.key.clone())
                    .or_default()
                    .push((v.to_owned(), index)),
                Some(v) => {
                    level
                        .exact
                        .entry(d.key.clone())
                        .or_default()
                        .insert(v.to_owned(), index);
                }
            }
        }
        Ok(())
    }

    fn add_limit(
        &mut self,
        rl: &RateLimitDoc,
        d: &DescriptorDoc,
        here: &str,
    ) -> Result<usize, PolicyError> {
        let name = rl.name.clone().unwrap_or_default();
        if !name.is_empty() {
            text(&format!("{here}.rate_limit.name"), &name)?;
        }
        check_replaces(rl, d, here, &name)?;
        let allowance = allowance_of(rl, here)?;
        self.limits.push(Limit {
            name,
            allowance,
            shadow: d.shadow_mode,
            replaces: d
                .replaces
                .iter()
                .chain(&rl.replaces)
                .map(|r| r.name.clone())
                .collect(),
            detailed_metric: d.detailed_metric,
            quota: d.quota_mode,
        });
        Ok(self.limits.len() - 1)
    }

    /// The fixed-window rules the domain's counted limits run as, numbering them into
    /// `limits` (a limit of 0 or unlimited has none). Rule names come from the limit's
    /// `name`, or from the descriptor's path, made unique.
    pub fn rules(&mut self) -> Vec<Rule> {
        let mut paths = vec![String::new(); self.limits.len()];
        fn walk(ds: &[DescriptorDoc], prefix: &str, next: &mut usize, out: &mut [String]) {
            for d in ds {
                let mut here = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}-")
                };
                here.push_str(&d.key);
                if let Some(v) = &d.value {
                    here.push('-');
                    here.push_str(v);
                }
                if d.rate_limit.is_some() {
                    out[*next] = here.clone();
                    *next += 1;
                }
                walk(&d.descriptors, &here, next, out);
            }
        }
        // Limits were numbered depth first in file order, as `walk` visits them.
        let mut next = 0;
        walk(&self.doc.descriptors, "", &mut next, &mut paths);
        let mut taken: std::collections::HashSet<String> = Default::default();
        // The next suffix to try for each base name: 10,000 limits of one name took
        // 10,000 tries each (quadratic work on the request thread); now each base
        // carries on where it stopped.
        let mut next_suffix: std::collections::HashMap<String, usize> = Default::default();
        let mut rules = Vec::new();
        for (i, limit) in self.limits.iter_mut().enumerate() {
            let Allowance::Count {
                requests_per_unit,
                unit,
                rule,
            } = &mut limit.allowance
            else {
                continue;
            };
            if *requests_per_unit == 0 {
                continue;
            }
            let base = rule_name(if limit.name.is_empty() {
                &paths[i]
            } else {
                &limit.name
            });
            let mut name = base.clone();
            if !taken.insert(name.clone()) {
                let n = next_suffix.entry(base.clone()).or_insert(2);
                loop {
                    let suffix = format!("-{n}");
                    let mut cut = base.clone();
                    cut.truncate(64 - suffix.len());
                    name = format!("{cut}{suffix}");
                    *n += 1;
                    if taken.insert(name.clone()) {
                        break;
                    }
                }
            }
            *rule = Some(rules.len());
            rules.push(
                Rule::new(
                    rules.len(),
                    &name,
                    Algorithm::FixedWindow {
                        limit: u64::from(*requests_per_unit),
                        window_ms: unit.seconds() * 1000,
                    },
                    Some(vec![DIMENSION.to_owned()]),
                    self.counts == Counting::EveryHit,
                )
                .expect("a valid name and window"),
            );
        }
        rules
    }
}

/// A rule name made from free text: lower case, other characters as `-`, at most 64.
fn rule_name(raw: &str) -> String {
    let mut name = super::name_chars(raw);
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name = format!("d{name}");
    }
    // Two paths cut alike are told apart by a suffix (`Descriptors::rules`).
    name.truncate(64);
    name
}

fn text(field: &str, value: &str) -> Result<(), PolicyError> {
    if value.len() > MAX_TEXT {
        return Err(PolicyError::field(
            field,
            format!("is {} bytes; at most {MAX_TEXT} are allowed", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(PolicyError::field(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// What a descriptor's `rate_limit` (found at `here`) allows: unlimited, or so many a unit
/// (its rule numbered later, by `EnvoyDomain::rules`).
fn allowance_of(rl: &RateLimitDoc, here: &str) -> Result<Allowance, PolicyError> {
    Ok(if rl.unlimited {
        if rl.unit.is_some() {
            return Err(PolicyError::field(
                format!("{here}.rate_limit.unit"),
                "must be left out when unlimited is true",
            ));
        }
        if rl.requests_per_unit.is_some() {
            return Err(PolicyError::field(
                format!("{here}.rate_limit.requests_per_unit"),
                "must be left out when unlimited is true",
            ));
        }
        Allowance::Unlimited
    } else {
        let unit = match rl.unit.as_deref() {
            None => {
                return Err(PolicyError::field(
                    format!("{here}.rate_limit.unit"),
                    "is required (second, minute, hour, day, week, month or year)",
                ));
            }
            Some(raw) => Unit::parse(raw).ok_or_else(|| {
                PolicyError::field(
                    format!("{here}.rate_limit.unit"),
                    format!(
                        "{raw:?} is not a unit: second, minute, hour, day, week, month or year"
                    ),
                )
            })?,
        };
        let requests_per_unit = rl.requests_per_unit.unwrap_or(0);
        if u64::from(requests_per_unit) > crate::domain::rule::MAX_AMOUNT {
            return Err(PolicyError::field(
                format!("{here}.rate_limit.requests_per_unit"),
                format!("at most {}", crate::domain::rule::MAX_AMOUNT),
            ));
        }
        Allowance::Count {
            requests_per_unit,
            unit,
            rule: None,
        }
    })
}

/// The names a limit `replaces` (beside its `rate_limit` or inside it, as upstream writes
/// it): each given, and none its own `name`.
fn check_replaces(
    rl: &RateLimitDoc,
    d: &DescriptorDoc,
    here: &str,
    name: &str,
) -> Result<(), PolicyError> {
    let beside = d
        .replaces
        .iter()
        .enumerate()
        .map(|(j, r)| (format!("{here}.replaces[{j}].name"), r));
    let inside = rl
        .replaces
        .iter()
        .enumerate()
        .map(|(j, r)| (format!("{here}.rate_limit.replaces[{j}].name"), r));
    for (field, r) in beside.chain(inside) {
        if r.name.is_empty() {
            return Err(PolicyError::field(field, "is required"));
        }
        if r.name == name {
            return Err(PolicyError::field(
                field,
                "names this descriptor's own limit; a limit cannot replace itself",
            ));
        }
    }
    Ok(())
}

/// A descriptor's own fields, found at `here`: a key, texts within their length, and
/// `replaces` only beside a `rate_limit`.
fn check_descriptor(d: &DescriptorDoc, here: &str) -> Result<(), PolicyError> {
    if d.key.is_empty() {
        return Err(PolicyError::field(format!("{here}.key"), "is required"));
    }
    text(&format!("{here}.key"), &d.key)?;
    if let Some(v) = &d.value {
        text(&format!("{here}.value"), v)?;
    }
    if d.rate_limit.is_none() && !d.replaces.is_empty() {
        return Err(PolicyError::field(
            format!("{here}.replaces"),
            "needs a rate_limit on the same descriptor",
        ));
    }
    if d.share_threshold && !d.value.as_deref().is_some_and(|v| v.contains('*')) {
        return Err(PolicyError::field(
            format!("{here}.share_threshold"),
            "needs a wildcard value (containing *): the values it matches share one counter",
        ));
    }
    Ok(())
}

/// The error for descriptor `d` at `here`, whose key and value the one at `first` has.
fn repeated(d: &DescriptorDoc, here: &str, first: &str) -> PolicyError {
    PolicyError::field(
        here,
        format!(
            "duplicates {first}: key {:?}{} appears twice at one level",
            d.key,
            d.value
                .as_deref()
                .map(|v| format!(" with value {v:?}"))
                .unwrap_or_default()
        ),
    )
}
