//! The shape of the code, checked: the engine names no Kubernetes crate,
//! modules import only downwards (the layers of docs/development.md), no
//! two files import each other, directly or around a cycle, and no function
//! in `src/` is longer than 150 lines.
//!
//! Imports are read from the source: every `crate::…` and `super::…` path
//! outside comments and `#[cfg(test)] mod tests`, resolved to the file of
//! the longest module prefix it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src is readable") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's module path: `src/controller/reconcile/mod.rs` → `controller::reconcile`.
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    if parts.first().is_some_and(|p| p == "bin") {
        parts.clear();
    }
    parts
}

/// The code of a file without comments and without its unit-test module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths like `crate::a::b`, `super::super::x` or `child::y` (a child module
/// of a `mod.rs`) in the code, as absolute module paths.
fn paths(
    code: &str,
    module: &[String],
    is_mod_file: bool,
    children: &[String],
) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut i = 0;
    while i < bytes.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        let child = children
            .iter()
            .any(|c| rest.starts_with(c.as_str()) && rest[c.len()..].starts_with("::"));
        let starts = rest.starts_with("crate::") || rest.starts_with("super::") || child;
        let boundary = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        if starts && boundary {
            let mut j = i;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            let segs: Vec<&str> = code[i..j].split("::").filter(|s| !s.is_empty()).collect();
            // A `mod.rs`'s module is its folder, so its `super` is the
            // folder's parent; any other file's `super` is its folder.
            let mut base: Vec<String> = Vec::new();
            let mut k = 0;
            if segs[0] == "crate" {
                k = 1;
            } else if segs[0] != "super" {
                base = module.to_vec();
            } else {
                base = module.to_vec();
                if !is_mod_file {
                    base.pop();
                    // `super` of a leaf file: the first `super` names the folder.
                    k = 1;
                }
                while k < segs.len() && segs[k] == "super" {
                    base.pop();
                    k += 1;
                }
            }
            base.extend(segs[k..].iter().map(|s| (*s).to_owned()));
            out.push(base);
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

struct Graph {
    /// Module path → file.
    files: BTreeMap<Vec<String>, PathBuf>,
    /// File → files it imports.
    edges: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

fn graph() -> Graph {
    let mut all = Vec::new();
    rs_files(&src(), &mut all);
    let files: BTreeMap<Vec<String>, PathBuf> = all
        .iter()
        .filter(|f| !f.starts_with(src().join("bin")) && !f.ends_with("main.rs"))
        .map(|f| (module_of(f), f.clone()))
        .collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        let is_mod = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        let children: Vec<String> = if is_mod {
            files
                .keys()
                .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
                .map(|m| m[module.len()].clone())
                .collect()
        } else {
            Vec::new()
        };
        for p in paths(&code(&text), module, is_mod, &children) {
            // The longest prefix that is a module with a file.
            let target = (1..=p.len()).rev().find_map(|n| files.get(&p[..n]));
            if let Some(t) = target
                && t != file
            {
                edges.entry(file.clone()).or_default().insert(t.clone());
            }
        }
    }
    Graph { files, edges }
}

fn rel(p: &Path) -> String {
    p.strip_prefix(src())
        .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
}

#[test]
fn the_engine_names_no_kubernetes_crate() {
    let mut files = Vec::new();
    rs_files(&src().join("policy"), &mut files);
    assert!(!files.is_empty());
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            assert!(
                !line.contains("kube::") && !line.contains("k8s_openapi"),
                "{}:{}: the engine must not depend on kube or k8s-openapi: {line}",
                rel(&f),
                n + 1
            );
        }
    }
}

/// The layer of a top-level module, lowest first, as docs/development.md
/// lists them; every module has a layer of its own, so no two modules may
/// import each other. (The gateway's admission core is the `lanes` crate,
/// pure by its dependency tree, which `.ci/run` checks.)
const LAYERS: [&str; 11] = [
    "snapshot",
    "scenario",
    "api",
    "policy",
    "metrics",
    "signals",
    "manifest",
    "controller",
    "gateway",
    "plan",
    "sim",
];

fn layer(module: &[String]) -> Option<(usize, &'static str)> {
    let first = module.first()?;
    LAYERS
        .iter()
        .position(|l| l == first)
        .map(|i| (i, LAYERS[i]))
}

#[test]
fn every_top_level_module_has_a_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert!(modules.len() >= LAYERS.len(), "{modules:?}");
    for m in modules {
        assert!(
            LAYERS.contains(&m),
            "src/lib.rs: module {m} has no layer in LAYERS"
        );
    }
    let doc = std::fs::read_to_string(src().join("../docs/development.md")).unwrap();
    let table = doc
        .split("Modules of the `lanekeeper` crate")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").nth(1))
        .expect("docs/development.md has the table of modules");
    let listed: Vec<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|m| LAYERS.contains(m))
        .collect();
    assert_eq!(
        listed, LAYERS,
        "docs/development.md lists the layers in this order"
    );
}

#[test]
fn modules_import_only_downwards() {
    let g = graph();
    let module_of_file: BTreeMap<&PathBuf, &Vec<String>> =
        g.files.iter().map(|(m, f)| (f, m)).collect();
    let mut wrong = Vec::new();
    for (from, tos) in &g.edges {
        let Some((lf, nf)) = layer(module_of_file[from]) else {
            continue;
        };
        for to in tos {
            if let Some((lt, nt)) = layer(module_of_file[to])
                && lt > lf
            {
                wrong.push(format!("{} ({nf}) imports {} ({nt})", rel(from), rel(to)));
            }
        }
    }
    // The engine and the signals never reach the controller, plan or sim.
    for (from, tos) in &g.edges {
        let mf = module_of_file[from];
        if !matches!(
            mf.first().map(String::as_str),
            Some("api" | "policy" | "signals")
        ) {
            continue;
        }
        for to in tos {
            let mt = module_of_file[to];
            if matches!(
                mt.first().map(String::as_str),
                Some("plan" | "sim" | "controller")
            ) {
                wrong.push(format!("{} imports {}", rel(from), rel(to)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_file_imports_itself_around_a_cycle() {
    let g = graph();
    // Tarjan's strongly connected components; any with more than one file
    // is a cycle.
    struct T<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        next: usize,
        sccs: Vec<Vec<&'a PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.g.get(v) {
            for w in ws {
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            t.sccs.push(scc);
        }
    }
    let mut t = T {
        g: &g.edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for f in g.files.values() {
        if !t.index.contains_key(f) {
            visit(&mut t, f);
        }
    }
    let cycles: Vec<String> = t
        .sccs
        .iter()
        .filter(|s| s.len() > 1)
        .map(|s| s.iter().map(|p| rel(p)).collect::<Vec<_>>().join(" ↔ "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
    // The checker sees imports at all (a parser that found none would pass).
    let controller_mod = src().join("controller/mod.rs");
    assert!(
        g.edges
            .get(&controller_mod)
            .is_some_and(|e| e.contains(&src().join("controller/reconcile/mod.rs"))),
        "controller/mod.rs imports controller/reconcile: {:?}",
        g.edges.get(&controller_mod)
    );
}

/// The longest a function in `src/` may be (the lanes crate and
/// `src/gateway/` are held to 80 by clippy's `too_many_lines`).
const MAX_FUNCTION_LINES: usize = 150;

/// Each `fn` of a rustfmt-formatted file with its length in lines: from the
/// line that opens it to the closing brace at its indentation.
fn functions(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = line.len() - code.len();
        let code = code
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("const ")
            .trim_start_matches("async ");
        let Some(rest) = code.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[i..].iter().position(|l| *l == close) {
            out.push((i + 1, name, end + 1));
        }
    }
    out
}

#[test]
fn no_function_in_src_is_over_the_budget() {
    let mut files = Vec::new();
    rs_files(&src(), &mut files);
    let mut long = Vec::new();
    let mut seen = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (line, name, len) in functions(&text) {
            seen += 1;
            if len > MAX_FUNCTION_LINES {
                long.push(format!("{}:{line}: fn {name} is {len} lines", rel(&f)));
            }
        }
    }
    assert!(seen > 500, "the scanner finds functions ({seen})");
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them along their phases):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_scanner_measures_to_the_closing_brace() {
    let text = "fn a() {\n    x;\n}\n\nimpl T {\n    pub fn b(\n        y: u8,\n    ) {\n        z;\n    }\n}\n";
    assert_eq!(
        functions(text),
        vec![(1, "a".to_owned(), 3), (6, "b".to_owned(), 5)]
    );
}
