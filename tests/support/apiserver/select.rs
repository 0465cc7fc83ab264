//! Label and field selectors as the API server parses them.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
pub enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Clone, Debug, Default)]
pub struct Selector(pub Vec<Req>);

fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn parse_set(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl Selector {
    pub fn parse_labels(s: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for term in split_top(s) {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            let req = if let Some(k) = t.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = t.split_once("!=") {
                Req::Ne(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = t.split_once("==") {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = t.split_once('=') {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some(idx) = t.find(" notin ") {
                let set = parse_set(&t[idx + 7..]).ok_or_else(|| format!("bad set in {t:?}"))?;
                Req::NotIn(t[..idx].trim().to_string(), set)
            } else if let Some(idx) = t.find(" in ") {
                let set = parse_set(&t[idx + 4..]).ok_or_else(|| format!("bad set in {t:?}"))?;
                Req::In(t[..idx].trim().to_string(), set)
            } else {
                Req::Exists(t.to_string())
            };
            let key = match &req {
                Req::Eq(k, _)
                | Req::Ne(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {key:?}"
                ));
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    /// Field selectors: `a.b=v`, `a.b==v`, `a.b!=v`, comma separated.
    pub fn parse_fields(s: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        for term in s.split(',') {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            let req = if let Some((k, v)) = t.split_once("!=") {
                Req::Ne(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = t.split_once("==") {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = t.split_once('=') {
                Req::Eq(k.trim().to_string(), v.trim().to_string())
            } else {
                return Err(format!("invalid field selector: {t:?}"));
            };
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    fn matches_with(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
            Req::Ne(k, v) => get(k).as_deref() != Some(v.as_str()),
            Req::In(k, set) => get(k).is_some_and(|x| set.contains(&x)),
            Req::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(&x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }

    pub fn matches_labels(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        self.matches_with(|k| {
            labels
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
    }

    pub fn matches_fields(&self, obj: &Value) -> bool {
        self.matches_with(|k| {
            let v = super::fields::get_dotted(obj, k);
            match v {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Null) | None => {
                    // Unset fields compare as the empty string, as on a real server.
                    Some(String::new())
                }
                Some(other) => Some(other.to_string()),
            }
        })
    }
}

/// Renders a `metav1.LabelSelector` object as a selector string (for the Scale subresource).
pub fn label_selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or_default()));
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default()
            {
                "In" => parts.push(format!("{key} in ({})", values.join(","))),
                "NotIn" => parts.push(format!("{key} notin ({})", values.join(","))),
                "Exists" => parts.push(key.to_string()),
                "DoesNotExist" => parts.push(format!("!{key}")),
                _ => {}
            }
        }
    }
    parts.join(",")
}
